"""The events other apps raise: an idle warning, a workload that fails or finishes, node and GPU health."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User

from inventory.choices import GpuHealth, NodeState
from inventory.models import Gpu
from inventory.services import mark_unreachable_nodes
from inventory.services.telemetry import fail_gpu
from jobs.choices import ReasonCode, WorkloadKind, WorkloadState
from jobs.models import Workload
from jobs.services.lifecycle import transition_workload
from jobs.services.stopping import stop_workload
from notifications import services
from notifications.choices import Channel, EventKind
from notifications.models import Delivery, Notification, NotificationPreference
from tenants.context import Actor
from tests.conftest import World
from tests.inventory.factories import make_node
from tests.jobs.test_idle import MINUTE, T0, FakeJupyter, _notebook
from tests.notifications.servers import Mailbox

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _idle_settings(settings: Any) -> None:
    settings.NOTEBOOK_IDLE_TIMEOUT_SECONDS = 3600
    settings.NOTEBOOK_IDLE_WARNING_SECONDS = 600
    settings.NOTEBOOK_IDLE_UTILIZATION = 5


def _opt_in(user: User, world: World, kind: str) -> None:
    NotificationPreference.all_tenants.create(tenant=world.tenant_a, user=user, kind=kind, email=True)


def _job(world: World, owner: User, state: WorkloadState = WorkloadState.RUNNING) -> Workload:
    return Workload.all_tenants.create(
        tenant=world.tenant_a, project=world.project_a, owner=owner, kind=WorkloadKind.JOB, name="train",
        image="registry.example.com/train:1", pool=world.pool, state=state,
    )  # fmt: skip


def _kinds() -> list[str]:
    return list(Notification.all_tenants.order_by("id").values_list("kind", flat=True))


def test_an_idle_warning_emails_the_notebook_owner(world: World, mailbox: Mailbox) -> None:
    from jobs.services import check_idle_notebooks

    notebook = _notebook(world)
    assert check_idle_notebooks(now=T0 + 50 * MINUTE, source=FakeJupyter())["warned"] == 1
    notification = Notification.all_tenants.get()
    assert notification.kind == EventKind.IDLE_WARNING and notification.tenant_id == world.tenant_a.pk
    assert notification.payload["workload"] == {"id": notebook.pk, "name": "explore", "kind": "notebook"}
    assert notification.payload["stop_at"] == "2025-01-01T01:00:00Z"
    delivery = Delivery.all_tenants.get()
    assert (delivery.channel, delivery.address) == (Channel.EMAIL, "member_a@example.com")
    services.send_delivery(delivery_id=delivery.pk)
    [(_, message)] = mailbox.received
    assert message["Subject"] == "Notebook explore is idle and will be hibernated at 01:00 UTC"
    # A second check does not warn again.
    check_idle_notebooks(now=T0 + 52 * MINUTE, source=FakeJupyter())
    assert Notification.all_tenants.count() == 1


def test_a_failed_workload_emails_an_owner_who_opted_in(world: World, mailbox: Mailbox) -> None:
    _opt_in(world.member_a, world, "workload.failed")
    workload = _job(world, world.member_a)
    assert stop_workload(
        workload_id=workload.pk, from_states=(WorkloadState.RUNNING,), to_state=WorkloadState.FAILED,
        reason_code=ReasonCode.MAX_RUNTIME, message="Stopped: it reached its maximum runtime of 1 h.",
    )  # fmt: skip
    notification = Notification.all_tenants.get()
    assert notification.kind == EventKind.WORKLOAD_FAILED and notification.subject == "Job train failed"
    assert notification.payload["reason_code"] == ReasonCode.MAX_RUNTIME
    assert notification.payload["owner"] == "member_a"
    services.send_delivery(delivery_id=Delivery.all_tenants.get().pk)
    [(recipients, message)] = mailbox.received
    assert recipients == ["member_a@example.com"] and "maximum runtime of 1 h" in message.get_payload()


def test_nothing_is_sent_for_an_owner_who_did_not_opt_in(world: World, mailbox: Mailbox) -> None:
    _opt_in(world.admin_a, world, "workload.failed")  # someone else's choice does not count
    for target in (WorkloadState.FAILED, WorkloadState.SUCCEEDED):
        workload = _job(world, world.member_a)
        assert transition_workload(
            workload_id=workload.pk, from_states=[WorkloadState.RUNNING], to_state=target, reason_code="exited",
            message="Done.",
        )  # fmt: skip
    assert not Notification.all_tenants.exists() and not Delivery.all_tenants.exists()


def test_a_finished_workload_reaches_a_subscribed_tenant_webhook_without_email(world: World) -> None:
    services.create_webhook(
        actor=Actor(user=world.admin_a), tenant=world.tenant_a, url="https://hooks.example.com/x",
        kinds=["workload.finished"],
    )  # fmt: skip
    workload = _job(world, world.member_a)
    transition_workload(
        workload_id=workload.pk, from_states=[WorkloadState.RUNNING], to_state=WorkloadState.SUCCEEDED,
        reason_code=ReasonCode.EXITED, message="Completed: every replica exited with code 0.",
    )  # fmt: skip
    assert _kinds() == ["workload.finished"]
    assert list(Delivery.all_tenants.values_list("channel", flat=True)) == [Channel.WEBHOOK]
    # Cancelling is not an ending anyone subscribes to.
    other = _job(world, world.member_a)
    transition_workload(workload_id=other.pk, from_states=[WorkloadState.RUNNING], to_state=WorkloadState.CANCELLED)
    assert _kinds() == ["workload.finished"]


def test_a_failed_gpu_and_a_lost_node_reach_operators_and_platform_webhooks(world: World, settings: Any) -> None:
    settings.NOTIFICATIONS_EMAIL = True
    services.create_webhook(
        actor=Actor(user=world.operator), tenant=None, url="https://ops.example.com/in", kinds=["node.health"]
    )
    node = make_node(Actor(user=world.operator), world.pool, name="n7", gpus=1)
    assert not Notification.all_tenants.exists(), "walking a node to ready is no health event"
    fail_gpu(Gpu.objects.get(node=node), health=GpuHealth.FAILED, reason="XID 79: fell off the bus")
    assert _kinds() == ["node.health"]
    notification = Notification.all_tenants.get()
    assert notification.subject == "Node n7: GPU 0 failed: XID 79: fell off the bus" and notification.tenant_id is None
    assert sorted(Delivery.all_tenants.values_list("channel", "address")) == [
        ("email", "operator@example.com"),
        ("webhook", "https://ops.example.com/in"),
    ]
    # The GPU's failure cordoned the node: an operator's decision, no health event of its own.
    assert node.__class__.objects.get(pk=node.pk).state == NodeState.CORDONED
    assert mark_unreachable_nodes(timeout=timedelta(seconds=1), now=T0 + timedelta(days=10_000)) == ["n7"]
    assert _kinds() == ["node.health", "node.health"]
    assert Notification.all_tenants.first().payload["to_state"] == "unreachable"  # type: ignore[union-attr]


def test_an_operator_who_turned_node_health_off_gets_no_email(world: World, settings: Any) -> None:
    settings.NOTIFICATIONS_EMAIL = True
    services.set_email_choices(actor=Actor(user=world.operator), tenant=None, choices={"node.health": False})
    node = make_node(Actor(user=world.operator), world.pool, name="n8", gpus=1)
    fail_gpu(Gpu.objects.get(node=node), health=GpuHealth.DEGRADED, reason="hot")
    assert not Notification.all_tenants.exists()


def test_budget_and_request_events_reach_admins_and_the_requester(world: World, settings: Any) -> None:
    from decimal import Decimal

    settings.NOTIFICATIONS_EMAIL = True
    start, end = T0, T0 + timedelta(days=31)
    threshold = services.notify_budget_threshold(
        tenant=world.tenant_a, budget_id=3, label="project alpha (GPU-hours)", unit="GPU-hours",
        used=Decimal("80.5"), amount=Decimal("100"), percent=80, period_start=start, period_end=end,
    )  # fmt: skip
    assert (
        threshold is not None and threshold.subject == "Tenant A: budget of project alpha (GPU-hours) has reached 80 %"
    )
    assert list(Delivery.all_tenants.values_list("address", flat=True)) == ["admin_a@example.com"]
    exhausted = services.notify_budget_exhausted(
        tenant=world.tenant_a, budget_id=3, label="project alpha (GPU-hours)", unit="GPU-hours",
        used=Decimal("100"), amount=Decimal("100"), period_start=start, period_end=end, users=[world.member_a],
    )  # fmt: skip
    assert exhausted is not None and exhausted.payload["percent"] == 100
    decided = services.notify_request_decided(
        tenant=world.tenant_a, request_id=9, requester_id=world.member_a.pk, what="quota increase for project alpha",
        state="approved", decided_by="admin_a", note="Go ahead.",
    )  # fmt: skip
    assert decided is not None and decided.subject == "Tenant A: your quota increase for project alpha was approved"
    assert "Note: Go ahead." in decided.body
