"""A data scientist in a real Chromium: launch a job from the form, land on its page, see why it waits."""

from __future__ import annotations

from typing import Any

import pytest

from jobs.models import Workload
from jobs.scheduler import shell
from tenants.context import Actor
from tenants.models import ProjectQuota
from tests.browser.test_console import log_in
from tests.conftest import World
from tests.inventory.factories import make_node
from tests.jobs.factories import assign

pytestmark = pytest.mark.browser


def test_a_member_launches_a_job_and_sees_why_it_waits(live_world: World, page: Any) -> None:
    # Alpha may hold 2 GPUs and already does: the job launched below must wait for its quota.
    world = live_world
    ProjectQuota.all_tenants.create(
        tenant=world.tenant_a, project=world.project_a, pool=world.pool, guaranteed=2, limit=2
    )
    make_node(Actor(user=world.operator), world.pool, name="n1", gpus=4, cpu_cores=32, memory_mib=256_000)
    assign(world.member_a, world.project_a)
    Workload.all_tenants.create(
        tenant=world.tenant_a,
        project=world.project_a,
        owner=world.member_a,
        name="big",
        image="registry.example.com/train:1",
        gpus_per_replica=2,
        pool=world.pool,
    )
    assert shell.run_pass() is not None

    log_in(page, "member_a")
    page.wait_for_url("**/t/tenant-a/")
    page.click("nav.tabs >> text=Launch")
    page.wait_for_url("**/t/tenant-a/launch/")
    form = page.locator("#launch form")
    form.locator("input[name=name]").fill("finetune")
    form.locator("input[name=image]").fill("registry.example.com/team/train:2.0")
    form.locator("input[name=command]").fill("python train.py --lr '3e-4'")
    form.locator("textarea[name=env]").fill("EPOCHS=3")
    form.locator("button[type=submit]").click()

    page.wait_for_url("**/t/tenant-a/workloads/*/")
    launched = Workload.all_tenants.get(name="finetune")
    assert page.url.endswith(f"/t/tenant-a/workloads/{launched.pk}/")
    assert launched.command == ["python", "train.py", "--lr", "3e-4"] and launched.env == {"EPOCHS": "3"}
    page.locator("#messages").get_by_text("Workload finetune submitted.").wait_for()
    assert page.locator("#workload-state .state").inner_text() == "Pending"

    # The scheduler looks at it (the controller does this every second); the page says why it waits.
    assert shell.run_pass() is not None
    page.reload()
    why = page.locator("#why-pending").inner_text()
    assert "Quota limit reached" in why and "position 1" in why, why
    assert page.locator("#why-pending .reason-code").get_attribute("title") == "QUOTA_LIMIT"
    assert page.locator("#action-cancel").is_visible()
