"""A data scientist in a real Chromium: three mistakes on the launch form are shown together, then fixed."""

from __future__ import annotations

from typing import Any

import pytest

from inventory.models import Gpu
from jobs.models import Workload
from tenants.models import AuditEvent
from tests.browser.test_console import log_in
from tests.conftest import World
from tests.jobs.factories import A100, H100, add_node, assign, give_quota

pytestmark = pytest.mark.browser


def _error_next_to(form: Any, field: str) -> str:
    """Return the error shown under the field's input, in the same label."""
    label = form.locator(f"label:has([name={field}])")
    return str(label.locator(".field-error").inner_text())


def test_a_member_sees_every_mistake_at_once_then_launches_on_a_chosen_gpu_model(live_world: World, page: Any) -> None:
    world = live_world
    give_quota(world)
    add_node(world, "n1", gpus=4, model=H100)
    add_node(world, "n2", gpus=4, model=A100)
    assign(world.member_a, world.project_a)
    audit_before = AuditEvent.all_tenants.count()

    log_in(page, "member_a")
    page.wait_for_url("**/t/tenant-a/")
    page.click("nav.tabs >> text=Launch")
    page.wait_for_url("**/t/tenant-a/launch/")
    form = page.locator("#launch form")
    form.locator("input[name=name]").fill("My Job!")
    form.locator("input[name=image]").fill("Registry/Team Train")
    form.locator("input[name=gpus_per_replica]").fill("-1")
    form.locator("button[type=submit]").click()

    page.wait_for_load_state()
    form = page.locator("#launch form")
    assert "lowercase letters, digits or hyphens" in _error_next_to(form, "name")
    assert "Must be an image reference" in _error_next_to(form, "image")
    assert "Must be between 0 and 64." in _error_next_to(form, "gpus_per_replica")
    assert form.locator(".field-error").count() == 3
    assert page.url.endswith("/t/tenant-a/launch/")
    assert not Workload.all_tenants.exists() and AuditEvent.all_tenants.count() == audit_before
    # What was typed stays, ready to correct.
    assert form.locator("input[name=image]").input_value() == "Registry/Team Train"

    form.locator("input[name=name]").fill("my-job")
    form.locator("input[name=image]").fill("registry.example.com/team/train:1.0")
    form.locator("input[name=gpus_per_replica]").fill("2")
    models = form.locator("select[name=gpu_model]")
    assert models.locator("option:checked").inner_text() == "Any model"
    models.select_option(label=f"{A100} (in shared)")
    form.locator("button[type=submit]").click()

    page.wait_for_url("**/t/tenant-a/workloads/*/")
    launched = Workload.all_tenants.get(name="my-job")
    assert page.url.endswith(f"/t/tenant-a/workloads/{launched.pk}/")
    page.locator("#messages").get_by_text("Workload my-job submitted.").wait_for()
    assert (launched.gpu_models, launched.gpus_per_replica) == ([A100], 2)
    assert Gpu.objects.filter(model=A100).count() == 4
