"""The console in a real Chromium: logging in, quotas with their validation, what a member sees."""

from __future__ import annotations

from typing import Any

import pytest

from tenants.models import AuditEvent, ProjectQuota
from tests.conftest import PASSWORD, World

pytestmark = pytest.mark.browser


def log_in(page: Any, username: str) -> None:
    page.goto("/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("#login-form button[type=submit]")


def test_log_in_lands_on_the_tenant_and_log_out_leaves(live_world: World, page: Any) -> None:
    log_in(page, "admin_a")
    page.wait_for_url("**/t/tenant-a/")
    assert page.locator("h2").first.inner_text() == "Tenant A"
    assert page.locator(".who").inner_text().startswith("admin_a")
    page.click("#logout")
    page.wait_for_url("**/login/")
    page.goto("/t/tenant-a/")
    page.wait_for_url("**/login/?next=/t/tenant-a/")


def test_wrong_password_is_refused(live_world: World, page: Any) -> None:
    page.goto("/login/")
    page.fill("input[name=username]", "admin_a")
    page.fill("input[name=password]", "not-the-password")
    page.click("#login-form button[type=submit]")
    assert "correct username and password" in page.locator(".form-errors").inner_text()


def test_tenant_admin_sets_a_project_quota_and_sees_an_impossible_one_refused(live_world: World, page: Any) -> None:
    log_in(page, "admin_a")
    page.wait_for_url("**/t/tenant-a/")
    page.goto("/t/tenant-a/quotas/")
    form = page.locator("#add-project-quota form")
    form.locator("select[name=pq-project]").select_option("alpha")
    form.locator("select[name=pq-pool]").select_option("shared")
    form.locator("input[name=pq-guaranteed]").fill("4")
    form.locator("input[name=pq-limit]").fill("8")
    form.locator("button[type=submit]").click()
    page.locator("#messages").get_by_text("Quota saved.").wait_for()
    row = page.locator("#project-quotas tbody tr").first
    assert row.locator("td").nth(2).inner_text() == "4" and row.locator("td").nth(3).inner_text() == "8"

    # Now an impossible one: a limit of 17 GPUs where the tenant's is 16.
    # htmx swaps the section in place, so a mark left on the window survives the round trip.
    events_before = AuditEvent.all_tenants.count()
    page.evaluate("window.notReloaded = true")
    edit = page.locator("#project-quotas tr.edit-row details").first
    edit.locator("summary").click()
    edit.locator("input[name$=-guaranteed]").fill("12")
    edit.locator("input[name$=-limit]").fill("17")
    edit.locator("button[type=submit]").first.click()
    error = page.locator("#project-quotas .field-error[data-field=limit]")
    error.wait_for()
    assert "exceeds the tenant's limit of 16" in error.inner_text()
    assert page.evaluate("window.notReloaded") is True, "the edit went through htmx, not a full page load"
    quota = ProjectQuota.all_tenants.get(project=live_world.project_a)
    assert (quota.guaranteed, quota.limit) == (4, 8), "a refused change writes nothing"
    assert AuditEvent.all_tenants.count() == events_before


def test_member_sees_no_admin_actions(live_world: World, page: Any) -> None:
    log_in(page, "member_a")
    page.wait_for_url("**/t/tenant-a/")
    assert page.locator("nav.tabs").get_by_text("Audit log").count() == 0
    page.goto("/t/tenant-a/projects/")
    assert page.locator("#create-project").count() == 0
    assert page.get_by_role("link", name="Edit").count() == 0
    page.goto("/t/tenant-a/members/")
    assert page.locator("#invite").count() == 0
    assert page.locator("details.row-edit").count() == 0
    page.goto("/t/tenant-a/quotas/")
    assert page.locator("#add-project-quota, #add-tenant-quota, tr.edit-row").count() == 0
    assert page.locator("#project-quotas").is_visible()
    response = page.goto("/t/tenant-a/audit/")
    assert response.status == 403


def test_outsider_gets_not_found_for_another_tenant(live_world: World, page: Any) -> None:
    log_in(page, "admin_b")
    page.wait_for_url("**/t/tenant-b/")
    response = page.goto("/t/tenant-a/quotas/")
    assert response.status == 404
    assert page.locator("#tenant-switcher").inner_text().count("Tenant A") == 0
