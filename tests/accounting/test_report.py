"""Usage reports against the ledger: exact seconds, split at period edges, once per replica, one tenant only."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from accounting.choices import Resource
from accounting.models import Price
from accounting.periods import Period, resolve_period
from accounting.selectors import Report, Usage, platform_report, tenant_report
from inventory.models import Gpu
from tenants.models import Project
from tests.accounting.factories import hold, minute, workload
from tests.conftest import World
from tests.jobs.factories import A100, H100, add_node

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 3, 1, tzinfo=UTC)  # a month's first instant
NOW = datetime(2026, 4, 20, tzinfo=UTC)
MARCH = Period("custom", T0, datetime(2026, 4, 1, tzinfo=UTC))


def _rows(report: Report) -> dict[tuple[str, ...], Usage]:
    return {row.key: row.usage for row in report.rows}


def test_work_across_a_month_boundary_is_split_exactly(world: World) -> None:
    node = add_node(world, gpus=1)
    gpu = node.gpus.get()
    work = workload(world, world.project_a, world.member_a)
    hold(work, node, gpu, T0 - timedelta(hours=2, seconds=7), T0 + timedelta(hours=3, seconds=11))
    feb = tenant_report(world.tenant_a, resolve_period(name="last-month", now=T0 + timedelta(days=3)), [], now=NOW)
    march = tenant_report(world.tenant_a, MARCH, [], now=NOW)
    assert feb.total.gpu_seconds == pytest.approx(7207, abs=1e-3)
    assert march.total.gpu_seconds == pytest.approx(10811, abs=1e-3)


def test_cpu_and_memory_count_once_per_replica_and_cpu_only_work_counts_no_gpu(world: World) -> None:
    node = add_node(world, gpus=2)
    gpus = list(node.gpus.order_by("index"))
    work = workload(world, world.project_a, world.member_a, gpus_per_replica=2, cpu_milli=4000, memory_mib=8192)
    for gpu in gpus:
        hold(work, node, gpu, T0, T0 + timedelta(hours=1))
    cpu_only = workload(world, world.project_a, world.member_a, name="etl", gpus_per_replica=0, cpu_milli=500)
    hold(cpu_only, node, None, T0, T0 + timedelta(hours=2))
    rows = _rows(tenant_report(world.tenant_a, MARCH, ["workload"], now=NOW))
    train = rows[(f"train #{work.pk}",)]
    assert (train.gpu_seconds, train.cpu_seconds, train.memory_gib_seconds) == pytest.approx((7200, 14400, 28800))
    etl = rows[(f"etl #{cpu_only.pk}",)]
    assert (etl.gpu_seconds, etl.cpu_seconds, etl.memory_gib_seconds) == pytest.approx((0, 3600, 8 * 3600))


def test_work_still_running_counts_until_now(world: World) -> None:
    node = add_node(world, gpus=1)
    hold(workload(world, world.project_a, world.member_a), node, node.gpus.get(), T0, None)
    now = T0 + timedelta(minutes=90)
    assert tenant_report(world.tenant_a, MARCH, [], now=now).total.gpu_seconds == pytest.approx(5400, abs=1e-3)


def test_a_tenant_report_holds_no_other_tenant_and_operators_see_both(world: World) -> None:
    node = add_node(world, gpus=2)
    gpu_a, gpu_b = node.gpus.order_by("index")
    hold(workload(world, world.project_a, world.member_a), node, gpu_a, T0, T0 + timedelta(hours=1))
    hold(workload(world, world.project_b, world.admin_b), node, gpu_b, T0, T0 + timedelta(hours=5))
    minute(gpu_b, T0 + timedelta(minutes=5), 90)
    report = tenant_report(world.tenant_a, MARCH, ["project", "user"], now=NOW)
    assert list(_rows(report)) == [("alpha", "member_a")]
    assert report.total.gpu_seconds == pytest.approx(3600)
    assert report.total.sampled_gpu_seconds == 0  # tenant B's minute is not ours
    everyone = _rows(platform_report(MARCH, ["tenant"], now=NOW))
    assert {key: usage.gpu_seconds for key, usage in everyone.items()} == pytest.approx(
        {("tenant-a",): 3600, ("tenant-b",): 18000}
    )


def test_utilization_counts_the_minutes_held_and_idle_ones_apart(world: World, settings: Any) -> None:
    settings.NOTEBOOK_IDLE_UTILIZATION = 5
    node = add_node(world, gpus=1)
    gpu = node.gpus.get()
    hold(workload(world, world.project_a, world.member_a), node, gpu, T0, T0 + timedelta(minutes=3))
    for offset, value in ((-1, 100), (0, 80), (1, 2), (2, 50), (3, 100)):  # only minutes 0..2 are held
        minute(gpu, T0 + timedelta(minutes=offset), value)
    usage = tenant_report(world.tenant_a, MARCH, [], now=NOW).total
    assert usage.sampled_gpu_seconds == 180
    assert usage.utilization == pytest.approx((80 + 2 + 50) / 3)
    assert usage.idle_gpu_seconds == 60


def test_prices_apply_from_their_date_and_the_most_specific_wins(world: World) -> None:
    node = add_node(world, gpus=2, model=H100)
    h100 = node.gpus.order_by("index").first()
    a100_node = add_node(world, "n2", gpus=1, model=A100)
    a100 = a100_node.gpus.get()
    change = T0 + timedelta(days=10)
    Price.objects.create(resource=Resource.GPU, amount_per_hour=Decimal("1"), effective_from=T0 - timedelta(days=30))
    Price.objects.create(
        resource=Resource.GPU, gpu_model=H100, amount_per_hour=Decimal("3"), effective_from=T0 - timedelta(days=30)
    )
    Price.objects.create(resource=Resource.GPU, gpu_model=H100, amount_per_hour=Decimal("4.5"), effective_from=change)
    Price.objects.create(
        resource=Resource.CPU, pool=world.pool, amount_per_hour=Decimal("0.01"), effective_from=T0 - timedelta(days=30)
    )
    work = workload(world, world.project_a, world.member_a, cpu_milli=2000, memory_mib=1024)
    hold(work, node, h100, change - timedelta(hours=2), change + timedelta(hours=1))  # 2 h at 3, 1 h at 4.5
    hold(work, a100_node, a100, T0, T0 + timedelta(hours=10))  # the platform price: 10 h at 1
    rows = _rows(tenant_report(world.tenant_a, MARCH, ["gpu_model"], now=NOW))
    assert rows[(H100,)].cost == Decimal("10.5") + Decimal("0.06")  # 6 + 4.5, and 3 h x 2 CPUs x 0.01
    assert rows[(A100,)].cost == Decimal("10") + Decimal("0.2")


def test_a_generated_month_matches_the_raw_allocations_to_the_second(world: World) -> None:
    """Preempted attempts, boundary crossings and open allocations: the report equals a plain sum over the ledger."""
    rng = random.Random(19)
    nodes = [add_node(world, f"n{i}", gpus=8) for i in range(3)]
    gpus: list[Gpu] = [gpu for node in nodes for gpu in node.gpus.all()]
    second = Project.all_tenants.create(tenant=world.tenant_a, slug="gamma", name="Gamma")
    owners = [world.member_a, world.admin_a, world.viewer_a]
    expected: dict[tuple[str, str], float] = defaultdict(float)
    now = datetime(2026, 3, 31, 18, tzinfo=UTC)
    for index in range(120):
        project = rng.choice([world.project_a, second])
        owner = rng.choice(owners)
        work = workload(world, project, owner, name=f"w{index}")
        start = T0 + timedelta(seconds=rng.randint(-3 * 86400, 33 * 86400))
        for attempt in range(rng.randint(1, 3)):  # preempted or failed attempts before the last
            gpu = rng.choice(gpus)
            length = timedelta(seconds=rng.randint(1, 3 * 86400), microseconds=rng.randint(0, 999_999))
            end = None if (attempt == 0 and rng.random() < 0.05) else start + length
            hold(work, gpu.node, gpu, start, end, replica=0)
            low, high = max(start, MARCH.start), min(end or now, MARCH.end, now)
            if high > low:
                expected[(project.slug, owner.username)] += (high - low).total_seconds()
            start = (end or now) + timedelta(seconds=rng.randint(0, 600))
    report = tenant_report(world.tenant_a, MARCH, ["project", "user"], now=now)
    got = {row.key: row.usage.gpu_seconds for row in report.rows}
    assert set(got) == set(expected)
    for key, seconds in expected.items():
        assert got[key] == pytest.approx(seconds, abs=1e-3), key
    assert report.total.gpu_seconds == pytest.approx(sum(expected.values()), abs=1e-2)
