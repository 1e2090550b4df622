"""The scheduling shell: snapshot from the ledger, core decisions committed in one transaction."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from inventory.choices import GpuHealth, NodeState
from inventory.models import Gpu, Node
from jobs.choices import WorkloadState
from jobs.models import Allocation, Workload, WorkloadEvent
from jobs.scheduler import commit, shell
from jobs.scheduler.core import Reason
from tenants.context import Actor
from tenants.models import Project, ProjectQuota, TenantQuota
from tests.conftest import World
from tests.inventory.factories import make_node

pytestmark = pytest.mark.django_db


def _quota(world: World, project: Project, guaranteed: int, limit: int, weight: int = 1) -> None:
    ProjectQuota.all_tenants.create(
        tenant=project.tenant, project=project, pool=world.pool, guaranteed=guaranteed, limit=limit, weight=weight
    )


def _workload(
    world: World, project: Project | None = None, *, gpus: int = 1, replicas: int = 1, **fields: Any
) -> Workload:
    project = project or world.project_a
    owner = world.member_a if project.tenant_id == world.tenant_a.pk else world.admin_b
    values: dict[str, Any] = {
        "tenant": project.tenant,
        "project": project,
        "owner": owner,
        "kind": "job",
        "name": "train",
        "image": "registry.example.com/train:1",
        "command": ["python", "train.py"],
        "env": {},
        "gpus_per_replica": gpus,
        "replicas": replicas,
        "gpu_models": [],
        "pool": world.pool,
        "cpu_milli": 1000,
        "memory_mib": 1024,
        "priority_class": "normal",
        **fields,
    }
    return Workload.all_tenants.create(**values)


def _node(world: World, name: str, gpus: int, **kwargs: Any) -> None:
    make_node(Actor(user=world.operator), world.pool, name=name, gpus=gpus, cpu_cores=64, memory_mib=512_000, **kwargs)


def _state(workload: Workload) -> str:
    return Workload.all_tenants.values_list("state", flat=True).get(pk=workload.pk)


def _gpus_of(workload: Workload) -> list[str]:
    return sorted(
        Allocation.all_tenants.filter(workload=workload, released_at__isnull=True).values_list("gpu__uuid", flat=True)
    )


def test_a_pending_workload_is_placed_best_fit_with_an_event(world: World) -> None:
    _quota(world, world.project_a, 8, 16)
    _node(world, "big", 8)
    _node(world, "small", 2)
    job = _workload(world, gpus=2)
    result = shell.run_pass()
    assert result is not None and result.placed == 1
    assert _state(job) == WorkloadState.SCHEDULED
    assert _gpus_of(job) == ["GPU-small-0", "GPU-small-1"], "best fit: the node the request fills exactly"
    event = WorkloadEvent.all_tenants.get(workload=job)
    assert (event.from_state, event.to_state) == ("pending", "scheduled")
    assert "small" in event.message


def test_a_gang_is_placed_all_or_nothing_across_nodes(world: World) -> None:
    _quota(world, world.project_a, 8, 16)
    _node(world, "n1", 4)
    _node(world, "n2", 4)
    gang = _workload(world, gpus=4, replicas=2)
    too_big = _workload(world, gpus=4, replicas=3, name="huge")
    shell.run_pass()
    assert _state(gang) == WorkloadState.SCHEDULED
    replicas = set(Allocation.all_tenants.filter(workload=gang).values_list("replica", "node__name"))
    assert replicas in ({(0, "n1"), (1, "n2")}, {(0, "n2"), (1, "n1")})
    assert _state(too_big) == WorkloadState.PENDING
    assert not Allocation.all_tenants.filter(workload=too_big).exists()


def test_a_docker_gang_spreads_only_over_nodes_recorded_in_one_swarm_with_a_manager(world: World) -> None:
    _quota(world, world.project_a, 16, 16)
    _node(world, "d1", 4, runtime="docker")
    _node(world, "d2", 4, runtime="docker")
    Node.objects.filter(name__in=["d1", "d2"]).update(swarm="swarm-1")  # as probed: both swarm workers
    gang = _workload(world, gpus=4, replicas=2)
    shell.run_pass()
    assert _state(gang) == WorkloadState.PENDING
    assert Workload.all_tenants.get(pk=gang.pk).reason_code == Reason.GANG_CANNOT_FIT
    Node.objects.filter(name="d2").update(swarm_manager=True)  # re-probed after its promotion
    shell.run_pass()
    assert _state(gang) == WorkloadState.SCHEDULED
    assert set(Allocation.all_tenants.filter(workload=gang).values_list("node__name", flat=True)) == {"d1", "d2"}


def test_nodes_that_never_reported_a_swarm_and_process_nodes_limit_no_gang(world: World) -> None:
    _quota(world, world.project_a, 16, 16)
    _node(world, "d1", 4, runtime="docker")  # swarm null: an agent older than the report
    _node(world, "p1", 4, runtime="process")
    _node(world, "p2", 4, runtime="process")
    Node.objects.filter(name__in=["p1", "p2"]).update(swarm="")  # a process node's probe says no swarm: no matter
    gang = _workload(world, gpus=4, replicas=3)
    shell.run_pass()
    assert _state(gang) == WorkloadState.SCHEDULED


def test_failed_gpus_and_nodes_out_of_service_are_never_used(world: World) -> None:
    _quota(world, world.project_a, 8, 16)
    _node(world, "sick", 2)
    Gpu.objects.filter(uuid="GPU-sick-0").update(health=GpuHealth.FAILED)
    _node(world, "cordoned", 4, state=NodeState.CORDONED)
    _node(world, "draining", 4, state=NodeState.DRAINING)
    one = _workload(world, gpus=1)
    two = _workload(world, gpus=2, name="two")
    shell.run_pass()
    assert _gpus_of(one) == ["GPU-sick-1"]
    assert _state(two) == WorkloadState.PENDING


def test_waiting_workloads_get_a_reason_a_sentence_and_their_position(world: World) -> None:
    _quota(world, world.project_a, 2, 2)
    _node(world, "n1", 4)
    now = timezone.now()
    running = _workload(world, gpus=2, submitted_at=now - timedelta(minutes=3))
    first = _workload(world, gpus=1, name="first", submitted_at=now - timedelta(minutes=2))
    second = _workload(world, gpus=1, name="second", submitted_at=now - timedelta(minutes=1))
    result = shell.run_pass()
    assert result is not None and (result.placed, result.waiting) == (1, 2)
    assert _state(running) == WorkloadState.SCHEDULED
    rows = {w.pk: w for w in Workload.all_tenants.filter(pk__in=[first.pk, second.pk])}
    assert rows[first.pk].reason_code == Reason.QUOTA_LIMIT and rows[first.pk].queue_position == 1
    assert rows[second.pk].queue_position == 2
    assert rows[first.pk].reason_message.startswith("Project alpha already uses 2 of its limit of 2 GPUs")


def test_a_pass_reads_the_ledger_in_a_fixed_number_of_queries(world: World) -> None:
    _quota(world, world.project_a, 8, 64)

    def queries_for_a_pass() -> int:
        with CaptureQueriesContext(connection) as captured:
            shell.run_pass()
        return sum(1 for q in captured.captured_queries if q["sql"].lstrip().upper().startswith("SELECT"))

    _node(world, "n1", 2)
    for i in range(3):
        _workload(world, gpus=1, name=f"a{i}")
    few = queries_for_a_pass()
    for i in range(2, 6):
        _node(world, f"n{i}", 8)
    for i in range(40):
        _workload(world, gpus=1, name=f"b{i}")
    assert queries_for_a_pass() == few


def test_reclaim_preempts_a_borrower_and_requeues_it(world: World, settings: Any) -> None:
    settings.SCHEDULER_MIN_RUNTIME_SECONDS = 0
    gamma = Project.all_tenants.create(tenant=world.tenant_a, slug="gamma", name="Gamma")
    TenantQuota.all_tenants.filter(pk=world.quota_a.pk).update(guaranteed=4, limit=4)
    _quota(world, world.project_a, 2, 4)
    _quota(world, gamma, 2, 4)
    _node(world, "n1", 4)
    hour_ago = timezone.now() - timedelta(hours=1)
    older = _workload(world, gpus=2, submitted_at=hour_ago)
    borrower = _workload(world, gpus=2, name="newer", submitted_at=hour_ago + timedelta(seconds=1))
    shell.run_pass(now=hour_ago + timedelta(seconds=2))
    assert _state(older) == _state(borrower) == WorkloadState.SCHEDULED
    Workload.all_tenants.filter(pk=older.pk).update(started_at=hour_ago)
    owner = _workload(world, gamma, gpus=2, name="mine")
    result = shell.run_pass()
    assert result is not None and (result.preempted, result.placed) == (1, 1)
    victim = Workload.all_tenants.get(pk=borrower.pk)
    assert (victim.state, victim.attempt, victim.reason_code) == ("pending", 2, Reason.RECLAIM_GUARANTEE)
    assert "borrowed" in victim.reason_message
    assert _state(older) == WorkloadState.SCHEDULED, "the borrower keeps its guarantee"
    assert _gpus_of(borrower) == [] and len(_gpus_of(owner)) == 2
    kinds = list(WorkloadEvent.all_tenants.filter(workload=borrower).values_list("to_state", flat=True))
    assert kinds[-2:] == ["preempted", "pending"]


def test_the_database_refuses_a_gpu_in_two_active_allocations(world: World) -> None:
    _node(world, "n1", 1)
    gpu = Gpu.objects.get(uuid="GPU-n1-0")
    first, second = _workload(world), _workload(world, name="other")
    Allocation.all_tenants.create(workload=first, tenant=world.tenant_a, replica=0, node=gpu.node, gpu=gpu)
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.all_tenants.create(workload=second, tenant=world.tenant_a, replica=0, node=gpu.node, gpu=gpu)


def test_a_pass_that_fails_mid_commit_leaves_nothing_behind(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    _quota(world, world.project_a, 8, 16)
    _node(world, "n1", 4)
    job = _workload(world, gpus=2)

    def crash(*args: Any) -> None:
        raise RuntimeError("controller killed")

    monkeypatch.setattr(commit, "_record_waiting", crash)
    with pytest.raises(RuntimeError):
        shell.run_pass()
    assert _state(job) == WorkloadState.PENDING
    assert not Allocation.all_tenants.exists() and not WorkloadEvent.all_tenants.exists()


def test_a_workload_cancelled_after_the_snapshot_is_not_placed(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    _quota(world, world.project_a, 8, 16)
    _node(world, "n1", 4)
    job = _workload(world, gpus=2)
    build = shell.build_snapshot

    def build_then_cancel(**kwargs: Any) -> Any:
        built = build(**kwargs)
        Workload.all_tenants.filter(pk=job.pk).update(state=WorkloadState.CANCELLED)
        return built

    monkeypatch.setattr(shell, "build_snapshot", build_then_cancel)
    result = shell.run_pass()
    assert result is not None and (result.placed, result.skipped) == (0, 1)
    assert not Allocation.all_tenants.exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_four_passes_at_once_allocate_no_gpu_twice(world: World) -> None:
    _quota(world, world.project_a, 8, 16)
    for i in range(4):
        _node(world, f"n{i}", 4)
    for i in range(24):
        _workload(world, gpus=1 + i % 3, name=f"w{i}")
    barrier = threading.Barrier(4)
    outcomes: list[object] = []

    def one_pass() -> None:
        try:
            barrier.wait()
            outcomes.append(shell.run_pass())
        except Exception as error:  # reported below
            outcomes.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=one_pass) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not [o for o in outcomes if isinstance(o, Exception)]
    assert sum(1 for o in outcomes if o is not None) >= 1, "at least one pass ran; the others found the lock held"
    active = list(Allocation.all_tenants.filter(released_at__isnull=True).values_list("gpu_id", flat=True))
    assert active and len(active) == len(set(active))


def test_a_pool_whose_nodes_are_all_out_of_service_is_reported_cordoned(world: World) -> None:
    _quota(world, world.project_a, 8, 16)
    _node(world, "c1", 4, state=NodeState.CORDONED)
    _node(world, "c2", 4, state=NodeState.DRAINING)
    job = _workload(world, gpus=1)
    shell.run_pass()
    waiting = Workload.all_tenants.get(pk=job.pk)
    assert (waiting.state, waiting.reason_code) == (WorkloadState.PENDING, Reason.POOL_CORDONED)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_pass_asked_for_while_another_runs_is_not_lost(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Work committed after a running pass read its snapshot is placed without waiting for the periodic pass."""
    from django.core.cache import cache

    from jobs.triggers import enqueue_scheduling_pass
    from tests.workers import running_worker, wait_until

    _quota(world, world.project_a, 8, 16)
    _node(world, "n1", 4)
    first = _workload(world, name="first")
    build = shell.build_snapshot
    read, go_on = threading.Event(), threading.Event()

    def slow_build(**kwargs: Any) -> Any:
        built = build(**kwargs)
        read.set()
        go_on.wait(30)  # a pass that takes its time while the lock is held
        return built

    def hold() -> None:
        try:
            shell.run_pass()
        finally:
            connections.close_all()

    monkeypatch.setattr(shell, "build_snapshot", slow_build)
    cache.delete(shell.PASS_WANTED_KEY)
    holder = threading.Thread(target=hold)
    holder.start()
    assert read.wait(20)
    with running_worker(["control"]):
        late = _workload(world, name="late")  # committed after the holder's snapshot
        enqueue_scheduling_pass()  # as its submission asks: the worker's pass finds the lock held
        assert wait_until(lambda: cache.get(shell.PASS_WANTED_KEY) is not None, timeout=15)
        monkeypatch.setattr(shell, "build_snapshot", build)
        go_on.set()
        holder.join(30)
        assert _state(first) == WorkloadState.SCHEDULED
        assert wait_until(lambda: _state(late) == WorkloadState.SCHEDULED, timeout=20), "the asked-for pass ran"
