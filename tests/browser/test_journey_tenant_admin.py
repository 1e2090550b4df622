"""The tenant admin's journey: from an invitation link to a tenant whose quota is shared out and audited.

From an empty database. The operator's part goes through its services — the
first operator (as `gpucloud up` creates it), a tenant, a pool with a node of
four GPUs, the tenant's quota there, the invitation of the tenant's first
admin. Everything the tenant admin (and the data scientist they invite) does
goes through the browser: the invitation page naming the user and the
tenant, setting a password and landing signed in on the tenant, a project,
its quota (first oversubscribing the tenant's guarantee, which is said and
then fixed), the invitation of a data scientist onto the project, that
person's invitation page and Launch offering the project, and the audit log
read in words, filtered by who acted and exported as CSV.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from inventory.services.pools import create_node_pool
from tenants import services as tenant_services
from tenants.context import Actor
from tenants.scoping import tenant_scope
from tenants.services.quotas import QuotaValues
from tests.browser.journey import Journey
from tests.conftest import PASSWORD
from tests.inventory.factories import make_node

pytestmark = pytest.mark.browser

ADMIN = "ada"
SCIENTIST = "dan"
NEW_PASSWORD = "correct horse battery staple 7"


@dataclass(frozen=True)
class Invited:
    """What the operator leaves behind: the tenant and the one-time link for its first admin."""

    tenant_slug: str
    link: str


@pytest.fixture
def invited(browser: Any, transactional_db: None) -> Invited:
    """An empty database set up by the operator: tenant, pool, node, quota, and the admin's invitation."""
    operator = User.objects.create_user("root", "root@example.com", PASSWORD, is_staff=True, is_superuser=True)
    as_operator = Actor(user=operator)
    tenant = tenant_services.create_tenant(actor=as_operator, slug="acme", name="Acme Research")
    pool = create_node_pool(actor=as_operator, name="gpu")
    make_node(as_operator, pool, name="gpu-01", gpus=4)
    values = QuotaValues(guaranteed=4, limit=8)
    tenant_services.create_tenant_quota(actor=as_operator, tenant=tenant, pool=pool, values=values)
    with tenant_scope(tenant):  # as the tenant's pages run it
        invitation = tenant_services.invite_member(actor=as_operator, tenant=tenant, username=ADMIN, role="admin")
    return Invited(tenant.slug, invitation.link_path)


def _accept(page: Any) -> None:
    page.fill("input[name=new_password1]", NEW_PASSWORD)
    page.fill("input[name=new_password2]", NEW_PASSWORD)
    page.get_by_role("button", name="Create my account and join").click()


def _log_out(page: Any) -> None:
    page.click("#logout")
    page.wait_for_url("**/login/")


def test_tenant_admin_shares_out_the_quota(invited: Invited, page: Any) -> None:
    journey = Journey("tenant-admin", "A tenant admin shares out the quota")
    t = f"/t/{invited.tenant_slug}"

    # The invitation link says who they are and where they were invited.
    page.goto(invited.link)
    invitation = page.locator("#invitation")
    assert "You were invited to Acme Research as tenant admin" in invitation.inner_text()
    assert "The invitation is for the user name ada" in invitation.inner_text()
    journey.step(page, "The invitation names the tenant, the role and the user name")

    # Setting the password signs them in, on their tenant.
    _accept(page)
    page.wait_for_url(f"**{t}/")
    assert page.locator("h2").first.inner_text() == "Acme Research"
    assert "you are signed in and a member" in page.locator("#messages").inner_text()
    journey.step(page, "Signed in on the tenant's overview right after choosing a password")

    # A project.
    page.goto(f"{t}/projects/")
    form = page.locator("#create-project form")
    form.locator("input[name=new-slug]").fill("vision")
    form.locator("input[name=new-name]").fill("Vision")
    form.locator("button[type=submit]").click()
    page.locator("#messages").get_by_text("Project vision created.").wait_for()
    assert "Vision" in page.locator("#projects").inner_text()
    journey.step(page, "A project created")

    # Its quota: 6 guaranteed GPUs where the tenant has 4 is saved, with a warning saying by how much.
    page.goto(f"{t}/quotas/")
    assert page.locator("#add-project-quota input[name=pq-limit]").input_value() == "", "an empty limit: no limit"
    form = page.locator("#add-project-quota form")
    form.locator("select[name=pq-project]").select_option("vision")
    form.locator("select[name=pq-pool]").select_option("gpu")
    form.locator("input[name=pq-guaranteed]").fill("6")
    form.locator("button[type=submit]").click()
    page.locator("#messages").get_by_text("Quota saved.").wait_for()
    warning = page.locator("#messages .flash-warning")
    assert "oversubscribed by 2" in warning.inner_text()
    assert "the tenant is guaranteed 4" in page.locator("#quotas .quota-warning").inner_text()
    row = page.locator("#project-quotas tbody tr").first
    assert "oversubscribed" in row.inner_text() and "no limit" in row.inner_text()
    journey.step(page, "Guaranteeing more than the tenant has is saved with a warning saying by how much")

    # Fixed: 3 of the tenant's 4; the warning goes.
    edit = page.locator("#project-quotas tr.edit-row details").first
    edit.locator("summary").click()
    assert edit.locator("input[name$=-limit]").input_value() == "", "no limit shows as an empty field"
    edit.locator("input[name$=-guaranteed]").fill("3")
    edit.locator("button[type=submit]").first.click()
    expect(page.locator("#project-quotas tbody tr").first.locator("td").nth(2)).to_have_text("3")
    expect(page.locator("#quotas .quota-warning")).to_have_count(0)
    assert "Quota saved." in page.locator("#messages").inner_text()
    journey.step(page, "The project's guarantee fits the tenant's again")

    # A data scientist, invited onto the project.
    page.goto(f"{t}/members/")
    form = page.locator("#invite form")
    form.locator("input[name=invite-username]").fill(SCIENTIST)
    form.locator("select[name=invite-role]").select_option("member")
    form.get_by_label("Vision").check()
    form.locator("button[type=submit]").click()
    page.locator("#messages").get_by_text("dan is invited: send them the link below.").wait_for()
    link = page.locator("#invite-link input").input_value()
    assert "vision" in page.locator("#invitations").inner_text(), "invited, not a member until dan answers"
    journey.step(page, "A data scientist invited onto the project, with a link to pass on")
    _log_out(page)

    # The data scientist's invitation names the project; Launch offers it.
    page.goto(link)
    text = page.locator("#invitation").inner_text()
    assert "You were invited to Acme Research as member, on the project Vision (vision)" in text
    assert "The invitation is for the user name dan" in text
    journey.step(page, "The data scientist's invitation names the project")
    _accept(page)
    page.wait_for_url(f"**{t}/")
    page.goto(f"{t}/launch/")
    assert page.locator("#no-projects").count() == 0
    choices = page.locator("#launch select[name=project] option").all_inner_texts()
    assert any("Vision" in choice or "vision" in choice for choice in choices), choices
    journey.step(page, "Launch offers the project: no dead end for the new member")
    _log_out(page)

    # The used link works no more.
    page.goto(link)
    assert "This link no longer works" in page.locator("#invitation").inner_text()
    page.goto("/login/")

    # The admin reads the audit log in words, filters it by who acted, and exports it.
    page.fill("input[name=username]", ADMIN)
    page.fill("input[name=password]", NEW_PASSWORD)
    page.click("#login-form button[type=submit]")
    page.wait_for_url(f"**{t}/")
    page.goto(f"{t}/audit/")
    log = page.locator("#audit").inner_text()
    assert "member dan" in log and "projects: vision" in log
    assert "project quota vision in pool gpu" in log and "guaranteed GPUs: 6 → 3" in log
    assert "@" not in page.locator("#audit td.subject").first.inner_text(), "no internal labels"
    journey.step(page, "The audit log says who changed what, in names, before and after")

    page.locator("#audit-filter select[name=actor]").select_option(ADMIN)
    page.locator("#audit-filter button[type=submit]").click()
    page.wait_for_url("**actor=ada**")
    actors = page.locator("#audit tbody tr td:nth-child(2)").all_inner_texts()
    assert actors and all(actor.startswith(ADMIN) for actor in actors), actors
    journey.step(page, "The audit log filtered to what the admin did")

    with page.expect_download() as download_info:
        page.locator("#audit-export").click()
    download = download_info.value
    rows = list(csv.reader(io.StringIO(Path(download.path()).read_text(encoding="utf-8"))))
    assert rows[0][:6] == ["time (UTC)", "actor", "token", "via", "action", "subject"]
    assert {row[1] for row in rows[1:]} == {ADMIN}
    assert any(row[5] == "project quota vision in pool gpu" and "6 → 3" in row[6] for row in rows[1:])
