"""Per-minute GPU rollups: exact merging, replays, stale backlogs, attribution to workloads, usage, retention."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from inventory import mailbox, selectors
from inventory.agent.reporter import Reporter
from inventory.drivers.simulated import SimulatedProbe
from inventory.models import Gpu, GpuMinute, Node
from inventory.services import apply_agent_reports, record_heartbeats
from inventory.services.rollups import MinutePartial, merge_minutes, parse_point, purge_expired_minutes
from inventory.tasks import apply_heartbeats, purge_telemetry
from jobs.choices import WorkloadKind, WorkloadState
from jobs.models import Allocation, Workload
from jobs.selectors import GpuUsage, gpu_usage_by_tenant, workload_gpu_minutes
from tenants.context import Actor
from tenants.scoping import tenant_scope
from tests.conftest import World
from tests.inventory.factories import make_node

# A minute well inside the retention period and behind the controller's clock.
M0 = int(timezone.now().timestamp()) // 60 * 60 - 600


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def _report(node: str, history: dict[str, Any], *, sent_at: float | None = None) -> dict[str, Any]:
    return {"node": node, "sent_at": sent_at if sent_at is not None else timezone.now().timestamp(), "history": history}


def _minute(uuid: str, epoch: int) -> GpuMinute:
    return GpuMinute.objects.get(gpu__uuid=uuid, minute=_at(epoch))


@pytest.fixture
def node(world: World) -> Node:
    return make_node(Actor(user=world.operator), world.pool, gpus=2)


# --- merging --------------------------------------------------------------------------------


def test_two_partial_batches_of_one_minute_merge_exactly(node: Node) -> None:
    first = [[M0 + 1, 10.0, 1000, 100.0, 40.0], [M0 + 2, 30.0, 3000, None, 45.0]]
    second = [[M0 + 3, 20.0, 2000, 300.0, None], [M0 + 59.5, 0.0, None, 200.0, 41.0]]
    assert record_heartbeats([_report("n1", {"GPU-n1-0": first})]) == 1
    assert record_heartbeats([_report("n1", {"GPU-n1-0": second})]) == 1
    row = _minute("GPU-n1-0", M0)
    assert (row.samples, row.utilization_sum, row.utilization_max) == (4, 60.0, 30.0)
    assert row.utilization_avg == 15.0
    assert (row.memory_used_max_mib, row.temperature_max) == (3000, 45.0)
    assert (row.power_samples, row.power_avg) == (3, 200.0), "a sample without power does not dilute its average"
    assert not GpuMinute.objects.filter(gpu__uuid="GPU-n1-1").exists()


def test_a_batch_splits_samples_at_minute_boundaries_and_keeps_gpus_apart(node: Node) -> None:
    history = {
        "GPU-n1-0": [[M0 + 59.999, 50.0, 1, 1.0, 1.0], [M0 + 60, 70.0, 2, 2.0, 2.0]],
        "GPU-n1-1": [[M0 + 30, 5.0, 9, 9.0, 9.0]],
    }
    record_heartbeats([_report("n1", history)])
    rows = GpuMinute.objects.order_by("gpu__uuid", "minute").values_list("gpu__uuid", "minute", "samples")
    assert list(rows) == [("GPU-n1-0", _at(M0), 1), ("GPU-n1-0", _at(M0 + 60), 1), ("GPU-n1-1", _at(M0), 1)]


def test_merge_of_partials_keeps_unknown_readings_unknown(node: Node) -> None:
    gpu_id = node.gpus.get(index=0).pk
    first = MinutePartial()
    first.add(12.5, None, None, None)
    merge_minutes({(gpu_id, M0): first})
    second = MinutePartial()
    second.add(7.5, 512, 80.0, 33.0)
    merge_minutes({(gpu_id, M0): second})
    row = _minute("GPU-n1-0", M0)
    assert (row.samples, row.utilization_sum, row.utilization_max) == (2, 20.0, 12.5)
    assert (row.memory_used_max_mib, row.power_samples, row.power_sum, row.temperature_max) == (512, 1, 80.0, 33.0)


# --- replays and backlogs -------------------------------------------------------------------


def test_a_replayed_report_is_not_counted_twice(node: Node) -> None:
    report = _report("n1", {"GPU-n1-0": [[M0 + 1, 40.0, 1, 1.0, 1.0], [M0 + 2, 60.0, 1, 1.0, 1.0]]})
    record_heartbeats([report, report])  # twice in one batch
    record_heartbeats([report])  # and again later
    overlapping = _report("n1", {"GPU-n1-0": [[M0 + 2, 60.0, 1, 1.0, 1.0], [M0 + 3, 80.0, 1, 1.0, 1.0]]})
    record_heartbeats([overlapping])
    row = _minute("GPU-n1-0", M0)
    assert (row.samples, row.utilization_sum) == (3, 180.0)
    assert Node.objects.get(pk=node.pk).samples_rolled_up_until == M0 + 3


def test_a_stale_backlog_is_rolled_up_but_does_not_revive_the_node(node: Node) -> None:
    Node.objects.filter(pk=node.pk).update(state="unreachable", resume_state="ready", last_heartbeat_at=None)
    old = timezone.now().timestamp() - 300
    stale = _report("n1", {"GPU-n1-0": [[M0 + 1, 10.0, 1, 1.0, 1.0]]}, sent_at=old)
    fresh = _report("n1", {"GPU-n1-0": [[M0 + 70, 30.0, 1, 1.0, 1.0]]})
    assert apply_agent_reports([stale]) == 0
    current = Node.objects.get(pk=node.pk)
    assert (current.state, current.last_heartbeat_at) == ("unreachable", None)
    assert _minute("GPU-n1-0", M0).samples == 1
    # A fresh report in the same batch as an older stale one: both are rolled up, whatever their order.
    older = _report("n1", {"GPU-n1-0": [[M0 + 65, 20.0, 1, 1.0, 1.0]]}, sent_at=old)
    assert apply_agent_reports([fresh, older]) == 1
    assert _minute("GPU-n1-0", M0 + 60).utilization_sum == 50.0
    assert Node.objects.get(pk=node.pk).state == "ready"


def test_reports_without_history_roll_up_their_latest_samples(node: Node) -> None:
    sample = {"uuid": "GPU-n1-1", "index": 1, "timestamp": M0 + 5.0, "utilization_gpu": 42.0, "memory_used_mib": 7}
    record_heartbeats([{"node": "n1", "samples": [sample, {**sample, "uuid": "GPU-n1-0", "lost": True}]}])
    row = _minute("GPU-n1-1", M0)
    assert (row.samples, row.utilization_max, row.memory_used_max_mib, row.power_samples) == (1, 42.0, 7, 0)
    assert GpuMinute.objects.count() == 1, "a lost GPU's sample has no reading to roll up"


def test_foreign_malformed_future_and_expired_samples_are_skipped(world: World, node: Node) -> None:
    make_node(Actor(user=world.operator), world.pool, name="n2", gpus=1)
    now = timezone.now().timestamp()
    history = {
        "GPU-n2-0": [[M0 + 1, 99.0, 1, 1.0, 1.0]],  # another node's GPU
        "GPU-unknown": [[M0 + 1, 99.0, 1, 1.0, 1.0]],
        "GPU-n1-0": [
            [M0 + 1, 101.0, 1, 1.0, 1.0],  # not a percentage
            [M0 + 2, "50", 1, 1.0, 1.0],
            [M0 + 3, 50.0, 1, 1.0],  # four fields
            "garbage",
            [now + 3600, 50.0, 1, 1.0, 1.0],  # from a clock an hour ahead
            [now - 91 * 86400, 50.0, 1, 1.0, 1.0],  # older than the retention period
            [M0 + 4, 25.0, -5, float("nan"), True],  # a usable point with nonsense readings
        ],
    }
    record_heartbeats([_report("n1", history)])
    row = GpuMinute.objects.get()
    assert (row.gpu.uuid, row.minute, row.samples, row.utilization_sum) == ("GPU-n1-0", _at(M0), 1, 25.0)
    assert (row.memory_used_max_mib, row.power_samples, row.temperature_max) == (None, 0, None)
    assert Node.objects.get(pk=node.pk).samples_rolled_up_until == M0 + 4, "refused samples move no mark"


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        ([1.5, 0, 0, 0, 0], (1.5, 0.0, 0, 0.0, 0.0)),
        ([1, 100, 80.9, None, -3], (1.0, 100.0, 80, None, -3.0)),
        ([1, -0.1, 0, 0, 0], None),
        ([float("inf"), 1, 0, 0, 0], None),
        ([None, 1, 0, 0, 0], None),
        ({"t": 1}, None),
    ],
)
def test_parse_point(raw: Any, parsed: Any) -> None:
    assert parse_point(raw) == parsed


# --- the agent to the table -----------------------------------------------------------------


class WallClock:
    """A controlled wall clock for both the reporter's heartbeat and the probe's sample timestamps."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_reporter_through_the_mailbox_fills_each_minute_once_it_ends(world: World) -> None:
    """1 Hz samples for over two minutes through the real mailbox: each minute complete a tick after it ends."""
    mailbox.drain_reports(lambda reports: None)
    clock = WallClock(M0 - 29.5)
    probe = SimulatedProbe("sim", gpu_count=2, clock=clock)
    busy, idle = (gpu.uuid for gpu in probe.inventory().gpus)
    node = make_node(Actor(user=world.operator), world.pool, name="sim")
    Gpu.objects.bulk_create(Gpu(node=node, index=i, uuid=uuid, model="H100") for i, uuid in enumerate((busy, idle)))
    probe.set_utilization(busy, 50.0)
    reporter = Reporter(node="sim", probe=probe, send_report=mailbox.post_report, clock=clock)
    for second in range(151):
        clock.now = M0 - 29.5 + second
        reporter.tick()
        apply_heartbeats()
        if clock.now == M0 + 60.5:  # the first tick of the minute after M0
            row = _minute(busy, M0)
            assert row.samples == 60, "minute M0 is complete on the first tick of the next one"
            assert 48.0 <= row.utilization_avg <= 52.0
    assert list(GpuMinute.objects.filter(gpu__uuid=idle).values_list("minute", "samples")) == [
        (_at(M0 - 60), 30),
        (_at(M0), 60),
        (_at(M0 + 60), 60),
        (_at(M0 + 120), 1),
    ]
    assert _minute(idle, M0).utilization_max == 0.0


# --- attribution ----------------------------------------------------------------------------


def _fill_minutes(node: str, gpus: dict[str, dict[int, float]]) -> None:
    """Roll up, in one report of `node`, one sample per {GPU UUID: {minute offset from M0: percent}}."""
    history = {
        uuid: [[M0 + 60 * offset + 30, percent, 100 * offset, 1.0, 1.0] for offset, percent in minutes.items()]
        for uuid, minutes in gpus.items()
    }
    record_heartbeats([_report(node, history)])


def _workload(world: World, name: str, *, project: Any = None, tenant: Any = None) -> Workload:
    return Workload.all_tenants.create(
        tenant=tenant or world.tenant_a,
        project=project or world.project_a,
        owner=world.member_a,
        kind=WorkloadKind.JOB,
        name=name,
        image="registry.example.com/train:1",
        pool=world.pool,
        state=WorkloadState.RUNNING,
    )


def _hold(workload: Workload, node: Node, index: int, start: float, end: float | None) -> Allocation:
    return Allocation.all_tenants.create(
        tenant_id=workload.tenant_id,
        workload=workload,
        replica=0,
        node=node,
        gpu=node.gpus.get(index=index),
        created_at=_at(start),
        released_at=_at(end) if end is not None else None,
    )


def test_a_gpu_that_changes_hands_attributes_each_minute_to_its_holders(world: World, node: Node) -> None:
    _fill_minutes("n1", {"GPU-n1-0": {0: 10.0, 1: 20.0, 2: 30.0, 3: 40.0, 4: 50.0}, "GPU-n1-1": {1: 90.0}})
    first, second = _workload(world, "first"), _workload(world, "second")
    _hold(first, node, 0, M0 + 15, M0 + 150)  # minutes 0, 1, 2 (given back during minute 2)
    _hold(second, node, 0, M0 + 150, None)  # from minute 2 on: minute 2 counts for both
    _hold(second, node, 1, M0 + 60, M0 + 120)  # exactly minute 1 of the other GPU
    since = _at(M0 - 3600)
    with tenant_scope(world.tenant_a):
        assert workload_gpu_minutes(first, since=since) == {
            "GPU-n1-0": [(M0, 10.0, 10.0, 0), (M0 + 60, 20.0, 20.0, 100), (M0 + 120, 30.0, 30.0, 200)]
        }
        assert workload_gpu_minutes(second, since=since) == {
            "GPU-n1-0": [(M0 + 120, 30.0, 30.0, 200), (M0 + 180, 40.0, 40.0, 300), (M0 + 240, 50.0, 50.0, 400)],
            "GPU-n1-1": [(M0 + 60, 90.0, 90.0, 100)],
        }
        assert workload_gpu_minutes(second, since=_at(M0 + 200)) == {
            "GPU-n1-0": [(M0 + 180, 40.0, 40.0, 300), (M0 + 240, 50.0, 50.0, 400)]
        }, "`since` cuts the window to the minute holding it; a GPU given back before it is left out"


def test_node_gpu_minutes_reads_the_nodes_gpus_since_a_time(world: World, node: Node) -> None:
    other = make_node(Actor(user=world.operator), world.pool, name="n2", gpus=1)
    _fill_minutes("n1", {"GPU-n1-1": {-70: 5.0, -1: 15.0, 0: 25.0}})
    _fill_minutes("n2", {"GPU-n2-0": {0: 99.0}})
    assert selectors.node_gpu_minutes(node, since=_at(M0 - 90)) == {
        "GPU-n1-1": [(M0 - 60, 15.0, 15.0, None), (M0, 25.0, 25.0, 0)]
    }
    assert list(selectors.node_gpu_minutes(other, since=_at(M0))) == ["GPU-n2-0"]


def test_usage_by_tenant_counts_held_gpu_minutes_and_sample_weighted_utilization(world: World, node: Node) -> None:
    history = {"GPU-n1-0": [[M0 + s, 60.0 if s < 30 else 20.0, 1, 1.0, 1.0] for s in range(60)]}  # avg 40, 60 samples
    history["GPU-n1-1"] = [[M0 + 60 + s, 100.0, 1, 1.0, 1.0] for s in range(0, 60, 6)]  # minute 1: avg 100, 10 samples
    record_heartbeats([_report("n1", history)])
    alpha, beta = _workload(world, "a1"), _workload(world, "b1", project=world.project_b, tenant=world.tenant_b)
    _hold(alpha, node, 0, M0 - 60, M0 + 30)  # 90 s, of which 30 s before the period
    _hold(alpha, node, 1, M0 + 60, M0 + 120)
    _hold(beta, node, 0, M0 + 30, None)  # held on: counts until the period's end
    usage = gpu_usage_by_tenant(start=_at(M0), end=_at(M0 + 180))
    assert usage == [
        GpuUsage("tenant-a", "alpha", gpu_minutes=1.5, utilization_avg=round((2400 + 1000) / 70, 2)),
        GpuUsage("tenant-b", "beta", gpu_minutes=2.5, utilization_avg=40.0),
    ]
    assert gpu_usage_by_tenant(start=_at(M0 + 180), end=_at(M0 + 240)) == [GpuUsage("tenant-b", "beta", 1.0, None)]


# --- retention ------------------------------------------------------------------------------


def test_purge_deletes_minutes_past_retention_in_batches(node: Node, settings: Any) -> None:
    settings.TELEMETRY_RETENTION_DAYS = 2
    now = timezone.now()
    gpu = node.gpus.get(index=0)
    kept = selectors.minute_start(now - timedelta(days=2)) + timedelta(minutes=1)
    old = [selectors.minute_start(now - timedelta(days=2, minutes=m)) for m in range(1, 6)]
    GpuMinute.objects.bulk_create(
        GpuMinute(gpu=gpu, minute=minute, samples=1, utilization_sum=1.0, utilization_max=1.0)
        for minute in [*old, kept]
    )
    assert purge_expired_minutes(now=now, batch=2) == 5
    assert list(GpuMinute.objects.values_list("minute", flat=True)) == [kept]
    assert purge_telemetry() == 0


# --- concurrency (Postgres: SQLite serializes writers) --------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_batches_for_one_node_count_every_sample_once(node: Node) -> None:
    """Eight controllers apply the same 20 reports at once, each in the agent's order: every sample counts once."""
    reports = [
        _report("n1", {"GPU-n1-0": [[M0 + 3 * r + k, float(r), 1, 1.0, 1.0] for k in range(3)]}) for r in range(20)
    ]
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def apply() -> None:
        try:
            barrier.wait(timeout=30)
            for report in reports:
                record_heartbeats([report])
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=apply) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    rows = GpuMinute.objects.filter(gpu__uuid="GPU-n1-0").values_list("samples", "utilization_sum")
    assert [sum(column) for column in zip(*rows, strict=True)] == [60, 3 * sum(range(20))]
    assert Node.objects.get(pk=node.pk).samples_rolled_up_until == M0 + 59
