"""The shell and time (issue 31): limits, predictions, preemptions, attained service and decayed usage in the
snapshot; estimates, reservations and preemption costs committed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from accounting.models import RollupMark, UsageHour
from inventory.models import Node
from jobs.choices import WorkloadState
from jobs.models import Allocation, Workload, WorkloadEvent
from jobs.scheduler import commit, core, shell
from jobs.scheduler.snapshot import build_snapshot
from tenants.models import ProjectQuota, TenantQuota
from tests.conftest import World
from tests.jobs.scheduler.test_shell import _node, _quota, _workload

pytestmark = pytest.mark.django_db

DAY = 86400


def _snapshot(now: datetime | None = None) -> tuple[core.Snapshot, Any]:
    return build_snapshot(now=now or timezone.now(), config=core.SchedulerConfig())


def _pending(snapshot: core.Snapshot, workload: Workload) -> core.Workload:
    return next(w for w in (*snapshot.pending, *snapshot.running) if w.id == str(workload.pk))


def _usage(snapshot: core.Snapshot, project: str | None) -> float:
    return sum(u.gpu_seconds for u in snapshot.usage if u.project == project)


# --- the snapshot ---------------------------------------------------------------------------------------------


def test_the_snapshot_carries_each_workloads_limit_prediction_preemptions_and_attained_time(world: World) -> None:
    _quota(world, world.project_a, 2, 8)
    ProjectQuota.all_tenants.filter(project=world.project_a).update(max_runtime_seconds=7200)
    TenantQuota.all_tenants.filter(pk=world.quota_a.pk).update(max_runtime_seconds=9000)
    own = _workload(
        world, max_runtime_seconds=600, predicted_runtime_seconds=300, preemptions=2, attained_seconds=120.5
    )
    from_project = _workload(world, name="p")
    from_tenant = _workload(world, world.project_b, name="t")
    TenantQuota.all_tenants.create(
        tenant=world.tenant_b, pool=world.pool, guaranteed=0, limit=4, max_runtime_seconds=9000
    )

    snapshot, _ = _snapshot()

    first = _pending(snapshot, own)
    assert (first.limit_s, first.predicted_s, first.preemptions, first.attained_s) == (600, 300, 2, 120.5)
    assert (_pending(snapshot, from_project).limit_s, _pending(snapshot, from_project).predicted_s) == (7200, None)
    assert _pending(snapshot, from_tenant).limit_s == 9000, "no project quota: the tenant's maximum"


def test_no_limit_anywhere_is_none(world: World) -> None:
    workload = _workload(world)
    snapshot, _ = _snapshot()
    assert _pending(snapshot, workload).limit_s is None


def _held(world: World, gpus: int, start: datetime, end: datetime | None, **fields: Any) -> Workload:
    """A workload of alpha that held `gpus` GPUs of node n1 from `start` to `end` (None: still)."""
    state = WorkloadState.RUNNING if end is None else WorkloadState.SUCCEEDED
    workload = _workload(world, gpus=gpus, state=state, started_at=start, finished_at=end, **fields)
    node = Node.objects.get(name="n1")
    for gpu in node.gpus.order_by("index")[:gpus]:
        Allocation.all_tenants.create(
            workload=workload, tenant=world.tenant_a, replica=0, node=node, gpu=gpu, created_at=start, released_at=end
        )
    return workload


def test_decayed_usage_halves_after_one_half_life(world: World) -> None:
    world.pool.usage_half_life_seconds = DAY
    world.pool.save()
    _quota(world, world.project_a, 2, 8)
    _node(world, "n1", 8)
    now = timezone.now()
    _held(world, 1, now - timedelta(hours=1), now)
    recent = _usage(_snapshot(now)[0], "alpha")
    Allocation.all_tenants.all().delete()
    _held(world, 1, now - timedelta(days=1, hours=1), now - timedelta(days=1))

    snapshot, _ = _snapshot(now)

    assert recent == pytest.approx(3600 * 0.986, rel=0.01), "an hour just ended weighs almost whole"
    assert _usage(snapshot, "alpha") == pytest.approx(recent / 2, rel=1e-6)
    assert _usage(snapshot, None) == pytest.approx(_usage(snapshot, "alpha")), "the tenant's own total"
    assert {(u.pool, u.tenant) for u in snapshot.usage} == {("shared", "tenant-a")}


def test_running_work_counts_until_now_and_a_pool_without_history_counts_none(world: World) -> None:
    _quota(world, world.project_a, 2, 8)
    _node(world, "n1", 8)
    now = timezone.now()
    _held(world, 2, now - timedelta(minutes=30), None)

    assert _usage(_snapshot(now)[0], "alpha") == pytest.approx(2 * 1800, rel=0.01)

    world.pool.usage_half_life_seconds = 0
    world.pool.save()
    assert _snapshot(now)[0].usage == ()


def test_settled_hours_come_from_the_rollups_with_the_same_decay(world: World) -> None:
    world.pool.usage_half_life_seconds = DAY
    world.pool.save()
    _quota(world, world.project_a, 2, 8)
    now = datetime(2026, 6, 1, 12, tzinfo=UTC)
    hour = now - timedelta(days=1, hours=1)
    RollupMark.objects.create(pk=1, rolled_from=now - timedelta(days=30), settled_until=now - timedelta(hours=3))
    UsageHour.all_tenants.create(
        tenant=world.tenant_a,
        hour=hour,
        project=world.project_a,
        owner=world.member_a,
        pool=world.pool,
        gpu_model="H100",
        gpu_seconds=3600,
    )

    exact = DAY / 0.6931471805599453 * (0.5 - 0.5 * 2 ** (-1 / 24))
    assert _usage(_snapshot(now)[0], "alpha") == pytest.approx(exact, rel=1e-6)
    UsageHour.all_tenants.update(gpu_seconds=1)  # the settled hours' sum is kept: only the decay moves on
    assert _usage(_snapshot(now + timedelta(days=1))[0], "alpha") == pytest.approx(exact / 2, rel=1e-6)


# --- the commit -----------------------------------------------------------------------------------------------


def _decide(**fields: Any) -> core.Decisions:
    fields = {"placements": {}, "preemptions": (), "waiting": {}, "fair_shares": {}, **fields}
    return core.Decisions(**fields)


def _commit(decisions: core.Decisions, now: datetime) -> list[int]:
    _, ledger = _snapshot(now)
    return commit._record_plans(decisions, ledger, now)


def test_estimates_and_reservations_are_written_then_cleared(world: World) -> None:
    _node(world, "n1", 2)
    waiting, other = _workload(world, gpus=2), _workload(world, name="other")
    now = timezone.now()
    start = now + timedelta(hours=2)
    decisions = _decide(
        estimates={str(waiting.pk): core.Estimate(start.timestamp(), "After workload 7 ends (its prediction).")},
        reservations=(
            core.Reservation(
                str(waiting.pk),
                "shared",
                start.timestamp(),
                (core.ReplicaAllocation("n1", ("GPU-n1-0", "GPU-n1-1")),),
            ),
        ),
    )

    assert _commit(decisions, now) == [waiting.pk]

    waiting.refresh_from_db()
    assert waiting.estimated_start_at == pytest.approx(start, abs=timedelta(milliseconds=1))
    assert waiting.estimate_basis == "After workload 7 ends (its prediction)."
    assert waiting.reserved_from == pytest.approx(start, abs=timedelta(milliseconds=1))
    assert waiting.reserved_gpus == [{"node": "n1", "gpus": ["GPU-n1-0", "GPU-n1-1"]}]
    assert _commit(decisions, now) == [], "unchanged: nothing written again"
    assert Workload.all_tenants.get(pk=other.pk).estimated_start_at is None

    assert _commit(_decide(), now) == [waiting.pk]
    waiting.refresh_from_db()
    assert (waiting.estimated_start_at, waiting.estimate_basis, waiting.reserved_from, waiting.reserved_gpus) == (
        None,
        "",
        None,
        [],
    )


def test_an_estimate_that_moved_less_than_the_slack_is_not_rewritten(world: World) -> None:
    waiting = _workload(world)
    now = timezone.now()

    def estimate(at: datetime) -> core.Decisions:
        return _decide(estimates={str(waiting.pk): core.Estimate(at.timestamp(), "basis")})

    assert _commit(estimate(now + timedelta(hours=1)), now) == [waiting.pk]
    assert _commit(estimate(now + timedelta(hours=1, seconds=10)), now) == []
    assert _commit(estimate(now + timedelta(hours=2)), now) == [waiting.pk]


def test_a_placed_workload_loses_its_estimate_and_reservation(world: World) -> None:
    _quota(world, world.project_a, 2, 8)
    _node(world, "n1", 2)
    workload = _workload(
        world,
        estimated_start_at=timezone.now(),
        estimate_basis="x",
        reserved_from=timezone.now(),
        reserved_gpus=[{"node": "n1", "gpus": ["GPU-n1-0"]}],
    )

    shell.run_pass()

    workload.refresh_from_db()
    assert workload.state == WorkloadState.SCHEDULED
    assert (workload.estimated_start_at, workload.reserved_from, workload.reserved_gpus) == (None, None, [])


def test_a_preemption_counts_keeps_the_checkpointed_progress_and_records_its_cost(world: World) -> None:
    started = timezone.now() - timedelta(hours=2)
    victim = _workload(
        world,
        gpus=2,
        state=WorkloadState.SCHEDULED,
        scheduled_at=started,
        started_at=started,
        checkpointed_at=started + timedelta(minutes=90),
        attained_seconds=100,
    )
    now = timezone.now()
    preemption = core.Preemption(
        str(victim.pk), core.Reason.RECLAIM_GUARANTEE, "99", lost_gpu_seconds=3600, overhead_gpu_seconds=120
    )
    _, ledger = _snapshot(now)

    commit.commit(_decide(preemptions=(preemption,)), ledger, now, commit.PassResult())

    victim.refresh_from_db()
    assert (victim.state, victim.preemptions, victim.lost_gpu_seconds) == (WorkloadState.PENDING, 1, 3600)
    assert victim.attained_seconds == pytest.approx(100 + 90 * 60)
    event = WorkloadEvent.all_tenants.get(workload=victim, to_state=WorkloadState.PREEMPTED)
    assert (event.lost_gpu_seconds, event.overhead_gpu_seconds) == (3600, 120)
    assert "It loses 1.0 GPU-hours of work" in event.message
    assert "Restarting costs another 2 GPU-minutes." in event.message


def test_a_checkpoint_of_an_earlier_attempt_keeps_nothing(world: World) -> None:
    started = timezone.now() - timedelta(hours=1)
    row = {"started_at": started, "scheduled_at": started, "checkpointed_at": started - timedelta(minutes=5)}
    assert commit.kept_seconds(row) == 0.0
    assert commit.kept_seconds({**row, "checkpointed_at": None}) == 0.0


def test_a_real_pass_reserves_gpus_for_blocked_work_and_estimates_its_start(world: World) -> None:
    _quota(world, world.project_a, 4, 8)
    _node(world, "n1", 4)
    started = timezone.now() - timedelta(minutes=10)
    running = _workload(world, gpus=4, name="running", max_runtime_seconds=3600)
    shell.run_pass(now=started)
    Workload.all_tenants.filter(pk=running.pk).update(state=WorkloadState.RUNNING, started_at=started)
    # Waiting longer than the core's starvation time: it gets the pool's reservation.
    blocked = _workload(world, gpus=4, name="blocked", submitted_at=started - timedelta(days=1))

    result = shell.run_pass()

    assert result is not None and result.placed == 0
    blocked.refresh_from_db()
    ends = started + timedelta(hours=1)
    assert blocked.reason_code and blocked.estimated_start_at is not None
    assert blocked.estimated_start_at == pytest.approx(ends, abs=timedelta(seconds=1)), (
        "when the running job's limit ends it"
    )
    assert blocked.estimate_basis
    assert blocked.reserved_from == pytest.approx(ends, abs=timedelta(seconds=1))
    assert [replica["node"] for replica in blocked.reserved_gpus] == ["n1"]
    assert len(blocked.reserved_gpus[0]["gpus"]) == 4

    Workload.all_tenants.filter(pk=running.pk).update(state=WorkloadState.SUCCEEDED, finished_at=timezone.now())
    Allocation.all_tenants.filter(workload=running).update(released_at=timezone.now())
    shell.run_pass()
    blocked.refresh_from_db()
    assert blocked.state == WorkloadState.SCHEDULED
    assert (blocked.estimated_start_at, blocked.reserved_from, blocked.reserved_gpus) == (None, None, [])
