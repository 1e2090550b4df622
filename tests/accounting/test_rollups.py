"""Hourly rollups: reports read from them say what the ledger says, re-rolls change nothing, late data is
folded in within the lateness window, and each tenant's hours stay its own."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounting.choices import Resource
from accounting.models import Price, RollupMark, UsageHour
from accounting.periods import Period
from accounting.selectors import Report, ledger, platform_report, tenant_report
from accounting.services.rollups import LATE, MAX_HOURS_PER_RUN, roll_up_hours, roll_up_recent, settled_after
from inventory.models import Gpu, GpuMinute, NodePool
from jobs.choices import WorkloadState
from jobs.models import Workload
from tenants.context import Actor
from tenants.models import Project
from tenants.scoping import TenantScopeError, tenant_scope
from tests.accounting.factories import hold, minute, workload
from tests.conftest import World
from tests.inventory.factories import make_node
from tests.jobs.factories import A100, H100, add_node

pytestmark = pytest.mark.django_db
HOUR = timedelta(hours=1)
T0 = datetime(2026, 3, 1, tzinfo=UTC)
MARCH = Period("custom", T0, datetime(2026, 4, 1, tzinfo=UTC))
LATE_MARCH = datetime(2026, 3, 31, 18, 25, 7, tzinfo=UTC)  # a report read while March runs
ROLLED = datetime(2026, 4, 20, tzinfo=UTC)  # when the month is rolled up: long settled

Reader = Callable[[Period, list[str], datetime, str], Report]


def _assert_same(raw: Report, rolled: Report) -> None:
    """Every row, total and bucket the same: seconds to the microsecond, money to the cent."""
    assert [row.key for row in rolled.rows] == [row.key for row in raw.rows]
    pairs = [(a.usage, b.usage) for a, b in zip(raw.rows, rolled.rows, strict=True)] + [(raw.total, rolled.total)]
    assert len(rolled.series) == len(raw.series)
    for (start, raw_rows), (rolled_start, rolled_rows) in zip(raw.series, rolled.series, strict=True):
        assert rolled_start == start
        assert [row.key for row in rolled_rows] == [row.key for row in raw_rows]
        pairs += [(a.usage, b.usage) for a, b in zip(raw_rows, rolled_rows, strict=True)]
    for want, got in pairs:
        for name in ("gpu_seconds", "cpu_seconds", "memory_gib_seconds", "sampled_gpu_seconds", "idle_gpu_seconds"):
            assert getattr(got, name) == pytest.approx(getattr(want, name), rel=0, abs=1e-6), name
        assert got.utilization_minutes == pytest.approx(want.utilization_minutes, rel=0, abs=1e-6)
        assert got.cost.quantize(Decimal("0.01")) == want.cost.quantize(Decimal("0.01"))


def _work(project: Project, owner: Any, pool: NodePool, name: str, rng: random.Random) -> Workload:
    gpus = rng.choice([0, 1, 1, 1, 2])
    return Workload.all_tenants.create(
        tenant_id=project.tenant_id,
        project=project,
        owner=owner,
        name=name,
        image="registry.example.com/team/train:1.0",
        pool=pool,
        state=WorkloadState.SUCCEEDED,
        gpus_per_replica=gpus,
        cpu_milli=rng.choice([500, 2000, 8000]),
        memory_mib=rng.choice([1024, 8192, 65536]),
    )


def _generated_month(world: World) -> None:
    """Two tenants, two pools, H100s and A100s; preempted attempts, work across the month's edges and still open,
    CPU-only and two-GPU replicas, prices changing mid-month at odd times, and GPU minutes here and there."""
    rng = random.Random(1919)
    fast = NodePool.objects.create(name="fast")
    shared_nodes = [add_node(world, "h0", gpus=8, model=H100), add_node(world, "a0", gpus=8, model=A100)]
    fast_node = make_node(Actor(user=world.operator), fast, name="f0", gpus=0)
    Gpu.objects.bulk_create(Gpu(node=fast_node, index=i, uuid=f"GPU-f0-{i}", model=H100) for i in range(4))
    gamma = Project.all_tenants.create(tenant=world.tenant_a, slug="gamma", name="Gamma")
    people = [
        (world.project_a, world.member_a),
        (world.project_a, world.admin_a),
        (gamma, world.viewer_a),
        (gamma, world.member_a),
        (world.project_b, world.admin_b),
    ]
    open_gpus: set[int] = set()
    for index in range(140):
        project, owner = rng.choice(people)
        node = rng.choice([*shared_nodes, fast_node])
        work = _work(project, owner, fast if node == fast_node else world.pool, f"w{index}", rng)
        start = T0 + timedelta(seconds=rng.randint(-3 * 86400, 33 * 86400), microseconds=rng.randint(0, 999_999))
        for attempt in range(rng.randint(1, 3)):  # preempted or failed attempts before the last
            length = timedelta(seconds=rng.randint(1, 3 * 86400), microseconds=rng.randint(0, 999_999))
            gpus = [g for g in node.gpus.order_by("index") if g.pk not in open_gpus]
            held = rng.sample(gpus, min(len(gpus), work.gpus_per_replica))
            still_open = attempt == 0 and rng.random() < 0.06
            open_gpus.update(g.pk for g in held if still_open)
            end = None if still_open else start + length
            for gpu in held:
                hold(work, node, gpu, start, end)
            if not held:  # CPU-only: the node's CPU and memory
                hold(work, node, None, start, end)
            start = (end or ROLLED) + timedelta(seconds=rng.randint(0, 600))
    _prices(world, fast)
    _minutes(rng)


def _prices(world: World, fast: NodePool) -> None:
    long_ago = T0 - timedelta(days=40)
    changes = [
        (Resource.GPU, None, "", "1.10", long_ago),
        (Resource.GPU, None, H100, "2.90", long_ago),
        (Resource.GPU, None, H100, "3.37", T0 + timedelta(days=9, hours=5, minutes=17, seconds=3, microseconds=5)),
        (Resource.GPU, fast, H100, "4.01", T0 + timedelta(days=12, hours=7, minutes=1)),
        (Resource.GPU, None, A100, "1.45", T0 + timedelta(days=25, hours=2, minutes=30)),
        (Resource.CPU, None, "", "0.0313", long_ago),
        (Resource.CPU, world.pool, "", "0.0291", T0 + timedelta(days=14)),  # on the hour
        (Resource.MEMORY, None, "", "0.0047", T0 + timedelta(days=20, hours=13, minutes=59, seconds=59)),
    ]
    for resource, pool, model, amount, start in changes:
        Price.objects.create(
            resource=resource, pool=pool, gpu_model=model, amount_per_hour=Decimal(amount), effective_from=start
        )


def _minutes(rng: random.Random) -> None:
    """A few GPUs sampled for hours: around the month's start, a price change and random days."""
    stretches = [T0 - timedelta(hours=5), T0 + timedelta(days=9, hours=2)]
    stretches += [T0 + timedelta(days=rng.randint(0, 30), hours=rng.randint(0, 23)) for _ in range(3)]
    gpus = list(Gpu.objects.order_by("id"))
    rows = []
    for begin in stretches:
        for gpu in rng.sample(gpus, 3):
            for offset in range(0, 8 * 60, rng.choice([1, 3])):
                value = rng.choice([0.0, 2.5, 4.9, 5.0, 37.0, 99.5, rng.uniform(0, 100)])
                samples = rng.randint(1, 12)
                rows.append(
                    GpuMinute(
                        gpu=gpu,
                        minute=begin + timedelta(minutes=offset),
                        samples=samples,
                        utilization_sum=value * samples,
                        utilization_max=value,
                    )
                )
    GpuMinute.objects.bulk_create(rows, ignore_conflicts=True)


def _readers(world: World) -> list[tuple[str, Reader]]:
    return [
        ("tenant", lambda period, by, now, bucket: tenant_report(world.tenant_a, period, by, now=now, bucket=bucket)),
        ("platform", lambda period, by, now, bucket: platform_report(period, [*by, "tenant"], now=now, bucket=bucket)),
    ]


ASKED = [
    (MARCH, ["project", "user"], ROLLED, ""),
    (MARCH, ["pool", "gpu_model"], ROLLED, ""),
    (MARCH, [], LATE_MARCH, ""),  # March as read on its last day: open work until now
    (MARCH, ["user"], ROLLED, "day"),
    (MARCH, ["workload"], ROLLED, ""),  # never rolled up: from the ledger
    (
        Period("custom", T0 + timedelta(days=3, hours=4, seconds=6.789), T0 + timedelta(days=17, minutes=2)),
        [],
        ROLLED,
        "",
    ),
    (Period("custom", T0 - timedelta(days=2, minutes=1), T0 + timedelta(days=2)), ["gpu_model"], ROLLED, "day"),
]


def test_a_generated_month_reads_the_same_from_the_rollups_as_from_the_ledger(world: World, settings: Any) -> None:
    settings.NOTEBOOK_IDLE_UTILIZATION = 5
    _generated_month(world)
    readers = _readers(world)
    raw = [(name, read, asked, read(*asked)) for name, read in readers for asked in ASKED]
    march = raw[0][3].total
    assert march.sampled_gpu_seconds > march.idle_gpu_seconds > 0 and march.cost > 0 and march.cpu_seconds > 0
    rolled = roll_up_hours(since=T0 - timedelta(days=3), until=MARCH.end + timedelta(days=1), now=ROLLED)
    assert rolled == 35 * 24
    assert UsageHour.all_tenants.exists()
    for name, read, asked, want in raw:
        with CaptureQueriesContext(connection) as queries:
            got = read(*asked)
        _assert_same(want, got)
        read_rollups = any(UsageHour._meta.db_table in query["sql"] for query in queries)
        assert read_rollups == ("workload" not in asked[1]), (name, asked)


def test_the_ledger_read_in_small_chunks_says_the_same(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Allocation ids and windows split over many queries (as a large fleet's are) add up to the same."""
    _generated_month(world)
    asked = [ASKED[0], ASKED[3], ASKED[5]]
    want = [read(*question) for _, read in _readers(world) for question in asked]
    monkeypatch.setattr(ledger, "IDS_PER_QUERY", 25)
    monkeypatch.setattr(ledger, "WINDOWS_PER_QUERY", 8)
    got = [read(*question) for _, read in _readers(world) for question in asked]
    roll_up_hours(since=T0 - timedelta(days=3), until=MARCH.end, now=ROLLED)
    rolled = [read(*question) for _, read in _readers(world) for question in asked]
    for raw, chunked, rolled_up in zip(want, got, rolled, strict=True):
        _assert_same(raw, chunked)
        _assert_same(raw, rolled_up)


def test_a_settled_month_without_price_changes_reads_only_the_rollups(world: World) -> None:
    node = add_node(world, gpus=1)
    gpu = node.gpus.get()
    hold(workload(world, world.project_a, world.member_a), node, gpu, T0 - HOUR * 3.5, T0 + timedelta(days=3.2))
    minute(gpu, T0 + timedelta(minutes=7), 42)
    want = tenant_report(world.tenant_a, MARCH, ["project", "user"], now=ROLLED)
    roll_up_hours(since=T0 - timedelta(days=1), until=MARCH.end, now=ROLLED)
    with CaptureQueriesContext(connection) as queries:
        got = tenant_report(world.tenant_a, MARCH, ["project", "user"], now=ROLLED)
    _assert_same(want, got)
    assert not [query for query in queries if "jobs_allocation" in query["sql"]]
    assert got.total.sampled_gpu_seconds == 60


def test_rolling_up_again_changes_nothing(world: World) -> None:
    _generated_month(world)
    roll_up_hours(since=T0 - timedelta(days=1), until=T0 + timedelta(days=6), now=ROLLED)
    first = _table()
    mark = RollupMark.objects.get()
    assert roll_up_hours(since=T0 + timedelta(days=2), until=T0 + timedelta(days=5, minutes=30), now=ROLLED) == 72
    assert _table() == first
    again = RollupMark.objects.get()
    assert (again.rolled_from, again.settled_until) == (mark.rolled_from, mark.settled_until)


def _table() -> list[tuple[Any, ...]]:
    fields = ["hour", "tenant_id", "project_id", "owner_id", "pool_id", "gpu_model", "gpu_seconds", "cpu_seconds"]
    fields += ["memory_gib_seconds", "sampled_gpu_seconds", "utilization_minutes", "idle_gpu_seconds"]
    return list(UsageHour.all_tenants.order_by(*fields[:6]).values_list(*fields))


def test_late_samples_and_releases_are_rolled_up_again_within_the_lateness_window(world: World) -> None:
    node = add_node(world, gpus=1)
    gpu = node.gpus.get()
    hour = T0 + HOUR * 5
    held = hold(workload(world, world.project_a, world.member_a), node, gpu, hour, None)
    day = Period("custom", T0, T0 + timedelta(days=1))
    first_run = hour + HOUR + timedelta(minutes=20)
    assert roll_up_recent(now=first_run) == 1  # the ledger starts at `hour`: it has closed, the next has not
    mark = RollupMark.objects.get()
    assert (mark.rolled_from, mark.settled_until) == (hour, hour)  # rolled up, not settled: too soon after it closed
    # Late: a minute of that hour reaches the database now, and a release stamped before its end commits now.
    minute(gpu, hour + timedelta(minutes=10), 90)
    held.released_at = hour + HOUR - timedelta(seconds=10)
    held.save()
    usage = tenant_report(world.tenant_a, day, [], now=first_run).total
    assert (usage.gpu_seconds, usage.sampled_gpu_seconds) == (3590, 60)  # from the ledger: the hour is not settled
    assert UsageHour.all_tenants.get(hour=hour).gpu_seconds == 3600  # what the early rollup said
    later = hour + HOUR + LATE + timedelta(minutes=5)
    assert roll_up_recent(now=later) == 3  # the unsettled hour again, and the two closed since
    mark = RollupMark.objects.get()
    assert mark.settled_until == hour + HOUR
    row = UsageHour.all_tenants.get(hour=hour)
    assert (row.gpu_seconds, row.sampled_gpu_seconds, row.utilization_minutes) == (3590, 60, 90)
    assert tenant_report(world.tenant_a, day, [], now=later).total == usage


def test_the_first_runs_catch_up_with_the_ledger_a_week_at_a_time(world: World) -> None:
    node = add_node(world, gpus=1)
    start = T0 + timedelta(minutes=13)
    hold(workload(world, world.project_a, world.member_a), node, node.gpus.get(), start, start + timedelta(days=9))
    now = T0 + timedelta(days=10, minutes=1)
    assert roll_up_recent(now=now) == MAX_HOURS_PER_RUN
    assert RollupMark.objects.get().settled_until == T0 + MAX_HOURS_PER_RUN * HOUR
    assert roll_up_recent(now=now) == 10 * 24 - MAX_HOURS_PER_RUN
    assert RollupMark.objects.get().settled_until == T0 + timedelta(days=10) - LATE
    assert sum(UsageHour.all_tenants.values_list("gpu_seconds", flat=True)) == pytest.approx(9 * 86400)


def test_rolled_up_hours_stay_one_run_without_gaps(world: World) -> None:
    node = add_node(world, gpus=1)
    hold(workload(world, world.project_a, world.member_a), node, node.gpus.get(), T0, T0 + timedelta(days=3))
    roll_up_hours(since=T0 + HOUR * 10, until=T0 + HOUR * 20, now=ROLLED)
    assert roll_up_hours(since=T0 + HOUR * 30, until=T0 + HOUR * 40, now=ROLLED) == 20  # from 20 h on: no gap
    assert roll_up_hours(since=T0, until=T0 + HOUR * 5, now=ROLLED) == 10  # up to 10 h: no gap
    mark = RollupMark.objects.get()
    assert (mark.rolled_from, mark.settled_until) == (T0, T0 + HOUR * 40)
    assert sorted(UsageHour.all_tenants.values_list("hour", flat=True)) == [T0 + HOUR * h for h in range(40)]
    with pytest.raises(ValueError, match="until"):
        roll_up_hours(since=T0 + HOUR, until=T0, now=ROLLED)


@pytest.mark.parametrize(
    ("settled", "first", "last", "cutoff", "expected"),
    [
        (0, 0, 10, 50, 10),  # the first rollup, long closed: all settled
        (0, 0, 10, 6, 6),  # the last four hours closed too recently
        (0, 0, 10, -5, 0),  # none closed long enough
        (20, 5, 10, 50, 20),  # rolled up again inside the settled hours
        (20, 15, 30, 50, 30),  # overlapping the end: settled further
        (20, 15, 30, 25, 25),
        (20, 25, 30, 50, 20),  # an unsettled gap before: nothing further counts
    ],
)
def test_the_settled_hours_end_at_the_first_one_rolled_up_too_early(
    settled: int, first: int, last: int, cutoff: int, expected: int
) -> None:
    at = lambda hours: T0 + HOUR * hours  # noqa: E731  # a table of hours reads best as numbers
    assert settled_after(at(settled), at(first), at(last), cutoff=at(cutoff)) == at(expected)


def test_each_tenant_reads_only_its_own_hours(world: World) -> None:
    node = add_node(world, gpus=2)
    gpu_a, gpu_b = node.gpus.order_by("index")
    hold(workload(world, world.project_a, world.member_a), node, gpu_a, T0, T0 + HOUR * 3)
    hold(workload(world, world.project_b, world.admin_b), node, gpu_b, T0, T0 + HOUR * 5)
    minute(gpu_b, T0 + timedelta(minutes=5), 90)
    roll_up_hours(since=T0, until=T0 + timedelta(days=1), now=ROLLED)
    with pytest.raises(TenantScopeError):
        UsageHour.objects.count()
    with tenant_scope(world.tenant_a):
        assert set(UsageHour.objects.values_list("tenant_id", "project_id")) == {
            (world.tenant_a.pk, world.project_a.pk)
        }
        assert UsageHour.objects.count() == 3
    report = tenant_report(world.tenant_a, MARCH, ["project", "user"], now=ROLLED)
    assert [row.key for row in report.rows] == [("alpha", "member_a")]
    assert (report.total.gpu_seconds, report.total.sampled_gpu_seconds) == (3 * 3600, 0)
    assert platform_report(MARCH, ["tenant"], now=ROLLED).total.gpu_seconds == 8 * 3600
