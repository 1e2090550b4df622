"""The operator's journey, from an empty database: the start page, a pool, a simulated node provisioned by
the in-process controller, a tenant with a GPU quota and an invited admin, then the heatmap and the node's
GPU table naming the workload that holds each GPU, and a cordon and a drain."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from inventory.models import Node, NodePool
from jobs import services as job_services
from jobs.models import Allocation, Workload
from tenants import services as tenant_services
from tenants.context import Actor
from tenants.models import Membership, Tenant
from tenants.scoping import tenant_scope
from tests.browser.journey import Journey
from tests.browser.test_console import log_in
from tests.conftest import PASSWORD
from tests.workers import running_worker, wait_until

pytestmark = pytest.mark.browser


def _admins_first_job(username: str) -> Workload:
    """What the invited tenant admin does next, through the services their pages use: a project with a
    share of the quota, and a 2-GPU job in it."""
    admin = Actor(user=User.objects.get(username=username))
    tenant = Tenant.objects.get(slug="acme")
    pool = NodePool.objects.get(name="gpu-a")
    with tenant_scope(tenant):  # as the tenant's pages set it
        project = tenant_services.create_project(actor=admin, tenant=tenant, slug="research", name="Research")
        membership = Membership.all_tenants.get(user=admin.user, tenant=tenant)
        tenant_services.update_member(actor=admin, membership=membership, role=membership.role, projects=[project])
        values = tenant_services.QuotaValues().merged({"guaranteed": 2, "limit": 4, "weight": 1})
        tenant_services.create_project_quota(actor=admin, project=project, pool=pool, values=values)
        data = {"name": "train", "image": "registry.example.com/acme/train:1", "pool": pool, "gpus_per_replica": 2}
        return job_services.submit_workload(actor=admin, project=project, data=data)


def test_an_operator_sets_up_the_cloud(transactional_db: None, live_page: Any) -> None:
    page = live_page
    journey = Journey("operator", "An operator sets up the cloud")
    User.objects.create_user("admin", password=PASSWORD, is_staff=True, is_superuser=True)  # what `gpucloud up` makes

    with running_worker(["control"]):
        log_in(page, "admin")
        page.wait_for_url("**/")
        assert page.get_by_role("heading", name="Operator start").is_visible()
        assert "Ask a tenant admin" not in page.content()
        steps = page.locator("#start-steps")
        assert steps.locator("li").count() == 5 and steps.locator(".badge-ok").count() == 0
        journey.step(page, "The start page lists what to do, in order, with a link for each step")

        steps.get_by_role("button", name="Create a pool").click()
        page.wait_for_url("**/ops/pools/")
        form = page.locator("#create-pool form")
        form.locator("input[name=name]").fill("gpu-a")
        form.locator("input[name=description]").fill("H100 training nodes")
        form.get_by_role("button", name="Create pool").click()
        page.locator("#messages").get_by_text("Pool created.").wait_for()
        assert page.locator("#pools tr[data-pool=gpu-a] input[name=description]").input_value() == "H100 training nodes"
        journey.step(page, "A pool is created; its settings can be changed in its row")

        page.goto("/")
        assert "done" in (page.locator("[data-step=pool]").get_attribute("class") or "")
        page.locator("[data-step=nodes]").get_by_role("button", name="Register a node").click()
        page.wait_for_url("**/ops/nodes/")
        form = page.locator("#register-node form")
        form.locator("input[name=new-name]").fill("sim-01")
        form.locator("select[name=new-pool]").select_option("gpu-a")
        form.locator("select[name=new-runtime]").select_option("simulated")
        form.locator("input[name=new-simulated_gpu_count]").fill("4")
        form.get_by_role("button", name="Register node").click()
        page.locator("#messages").get_by_text("Node sim-01 registered.").wait_for()
        row = page.locator("#nodes tr[data-node=sim-01]")
        assert "simulated" in row.locator("td").first.inner_text(), "a simulated node says so by its name"
        journey.step(page, "A simulated node is registered; Provision is a button in its row")

        row.get_by_role("button", name="Provision").click()
        page.locator("#messages").get_by_text("Node sim-01: registered → provisioning.").wait_for()
        assert wait_until(lambda: Node.objects.get(name="sim-01").state == "ready", timeout=20)
        page.reload()
        assert page.locator("#node-state").inner_text().startswith("Ready")
        assert page.locator("#node-gpus tbody tr").count() == 4
        assert page.locator("#node-gpus td.holder", has_text="free").count() == 4
        journey.step(page, "The controller probed the node: ready, with four free simulated GPUs")

        page.goto("/")
        tenant_form = page.locator("#create-tenant form")
        tenant_form.locator("input[name=slug]").fill("acme")
        tenant_form.locator("input[name=name]").fill("Acme Research")
        tenant_form.get_by_role("button", name="Create tenant").click()
        page.locator("#messages").get_by_text("Tenant acme created.").wait_for()
        journey.step(page, "A tenant is created from the start page")

        page.goto("/")
        page.locator("[data-step=quota]").get_by_role("button", name="Quotas of Acme Research").click()
        page.wait_for_url("**/t/acme/quotas/")
        add = page.locator("#add-tenant-quota")
        if add.locator("summary").count():
            add.locator("summary").click()
        add.locator("select[name=tq-pool]").select_option("gpu-a")
        add.locator("input[name=tq-guaranteed]").fill("4")
        add.locator("input[name=tq-limit]").fill("4")
        add.get_by_role("button", name="Add tenant quota").click()
        page.locator("#messages").get_by_text("Quota saved.").wait_for()
        assert "gpu-a" in page.locator("#quotas").inner_text()
        journey.step(page, "The tenant gets 4 guaranteed GPUs in the pool")

        page.goto("/")
        page.locator("[data-step=admin]").get_by_role("button", name="Members of Acme Research").click()
        page.wait_for_url("**/t/acme/members/")
        invite = page.locator("#invite form")
        invite.locator("input[name=invite-username]").fill("alice")
        invite.locator("input[name=invite-email]").fill("alice@acme.example")
        invite.locator("select[name=invite-role]").select_option("admin")
        invite.get_by_role("button", name="Invite").click()
        link = page.locator("#invite-link input").input_value()
        assert "/invite/" in link
        journey.step(page, "The tenant's admin is invited: the one-time link to pass on is shown once")
        # Alice answers the link (tests/browser/test_journey_tenant_admin.py walks that page).
        tenant_services.create_invited_account(secret=link.rstrip("/").rsplit("/", 1)[-1], password=PASSWORD)

        page.goto("/")
        assert page.locator("#start-steps .badge-ok").count() == 5, "every step is done"
        workload = _admins_first_job("alice")
        assert wait_until(lambda: Allocation.all_tenants.filter(workload_id=workload.pk).count() == 2, timeout=20)

        page.goto("/ops/cluster/")
        page.locator("#heatmap[data-synced=true]").wait_for()
        held = page.locator(".hm-nodes .hm-cell.hm-held")
        assert held.count() == 2 and page.locator("[data-node=sim-01] [data-node-sim]").is_visible()
        held.first.click()
        detail = page.locator("[data-heatmap-detail]")
        assert "acme / research / train" in detail.inner_text() and "alice" in detail.inner_text()
        journey.step(page, "The heatmap shows which GPUs the tenant's job holds; a click names it and links to it")

        detail.get_by_role("button", name="Open node sim-01").click()
        page.wait_for_url("**/ops/nodes/sim-01/")
        holders = page.locator("#node-gpus td.holder")
        assert holders.filter(has_text="acme / research / train").count() == 2
        assert holders.filter(has_text="free").count() == 2
        journey.step(page, "The node's GPU table names the workload holding each GPU, beside its utilization")

        cordon = page.locator("#action-cordon")
        cordon.locator("textarea").fill("replacing a fan")
        cordon.get_by_role("button", name="Cordon sim-01").click()
        page.locator("#messages").get_by_text("Node sim-01: ready → cordoned.").wait_for()
        drain = page.locator("#action-drain")
        drain.locator("textarea").fill("replacing a fan")
        drain.get_by_role("button", name="Drain sim-01").click()
        page.locator("#messages").get_by_text("Node sim-01: cordoned → draining.").wait_for()
        assert page.locator("#node-state").inner_text().startswith("Draining")
        journey.step(page, "Cordoned, then draining: no new work, and the running job finishes first")
