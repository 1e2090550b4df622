"""`gpucloud simulate --from-console`: the console's own finished workloads become the trace, on its nodes, with
its quotas; checked field by field against a small ledger, then replayed."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from jobs.choices import WorkloadKind, WorkloadState
from jobs.models import Workload
from jobs.scheduler.core import ProjectQuota, TenantQuota
from jobs.scheduler.simulator import cli
from jobs.scheduler.simulator.console import console_trace
from jobs.scheduler.simulator.traces import TraceJob, TraceNode
from tenants.models import Project
from tests.conftest import World
from tests.jobs.factories import H100, add_node, give_quota

pytestmark = pytest.mark.django_db

NOW = timezone.now().replace(microsecond=0)


def ran(world: World, project: Project, at_hours_ago: float, run_s: float, **fields: Any) -> Workload:
    """Return a workload of `project` submitted `at_hours_ago` hours ago that started 60 s later and ran `run_s`."""
    submitted = NOW - timedelta(hours=at_hours_ago)
    started = submitted + timedelta(seconds=60)
    defaults: dict[str, Any] = {
        "state": WorkloadState.SUCCEEDED,
        "started_at": started,
        "finished_at": started + timedelta(seconds=run_s),
        "image": "registry.example.com/team/train:1.0",
    }
    return Workload.all_tenants.create(
        tenant_id=project.tenant_id,
        project=project,
        owner=world.member_a,
        name="job",
        pool=world.pool,
        submitted_at=submitted,
        **{**defaults, **fields},
    )


@pytest.fixture
def ledger(world: World) -> dict[str, Workload]:
    """Two nodes (8 and 4 GPUs), alpha's project quota, and workloads that ran, and some that must not count."""
    add_node(world, "n1", gpus=8)
    add_node(world, "n2", gpus=4)
    give_quota(world, guaranteed=4, limit=8)
    return {
        "first": ran(world, world.project_a, 48, 3_600.0, max_runtime_seconds=7_200),
        "gang": ran(world, world.project_a, 47, 600.0, gpus_per_replica=4, replicas=2, gpu_models=[H100]),
        "failed": ran(world, world.project_a, 46, 100.0, state=WorkloadState.FAILED, image="other:2"),
        "notebook": ran(world, world.project_a, 45, 900.0, kind=WorkloadKind.NOTEBOOK, state="hibernated"),
        "requeued": ran(world, world.project_a, 44, 500.0, run_seconds=1_500.0),
        "old": ran(world, world.project_a, 24 * 30, 50.0),
        "never_started": ran(world, world.project_a, 40, 0.0, state=WorkloadState.CANCELLED, started_at=None),
        "pending": ran(world, world.project_a, 1, 0.0, state=WorkloadState.PENDING, started_at=None, finished_at=None),
    }


def test_the_trace_holds_the_finished_workloads_the_nodes_and_the_quotas(
    world: World, ledger: dict[str, Workload]
) -> None:
    trace, tenant_quotas, project_quotas = console_trace(since_days=7, now=NOW)
    origin = ledger["first"].submitted_at
    image = "registry.example.com/team/train:1.0"

    def expected(name: str, run_s: float, **fields: Any) -> TraceJob:
        workload = ledger[name]
        at = (workload.submitted_at - origin).total_seconds()
        base: dict[str, Any] = {"gpus": 1, "project": "alpha", "pool": "shared", "image": image}
        return TraceJob(str(workload.pk), "tenant-a", at, run_s, cpu_milli=1000, memory_mib=4096, **{**base, **fields})

    assert trace.jobs == (
        expected("first", 3_600.0, limit_s=7_200.0),
        expected("gang", 600.0, gpus=4, replicas=2, models=frozenset({H100})),
        expected("failed", 100.0, image="other:2"),
        expected("notebook", 900.0),
        expected("requeued", 1_500.0),  # what it ran in all, earlier attempts' kept progress included
    )
    assert [j.submitted_at for j in trace.jobs] == [0.0, 3_600.0, 7_200.0, 10_800.0, 14_400.0]
    assert trace.nodes == (
        TraceNode("n1", 8, H100, trace.nodes[0].cpu_milli, trace.nodes[0].memory_mib, "shared"),
        TraceNode("n2", 4, H100, trace.nodes[1].cpu_milli, trace.nodes[1].memory_mib, "shared"),
    )
    assert [p.name for p in trace.pools] == ["shared"]
    assert tenant_quotas == (TenantQuota("tenant-a", "shared", 8, 16, 1.0),)
    assert project_quotas == (ProjectQuota("alpha", "tenant-a", "shared", 4, 8, 1.0),)


def test_without_a_window_every_finished_workload_counts(world: World, ledger: dict[str, Workload]) -> None:
    trace, _, _ = console_trace(now=NOW)
    assert trace.jobs[0].id == str(ledger["old"].pk)
    assert len(trace.jobs) == 6


def test_the_replay_runs_every_recorded_workload(
    world: World, ledger: dict[str, Workload], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--from-console", "--since", "7", "--policy", "fifo"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["trace"], summary["jobs"], summary["finished"], summary["unfinished"]) == ("console", 5, 5, 0)
    assert summary["gpus"] == 12 and summary["quota_violations"] == 0
    # The first job's own limit (7,200 s) is above its run time: nothing recorded is killed.
    assert summary["killed_at_limit"] == 0
    assert summary["submitted_gpu_hours"] == round((3_600 + 8 * 600 + 100 + 900 + 1_500) / 3_600, 1)


def test_an_empty_console_is_refused(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--from-console"]) == 2
    assert "no finished workload" in capsys.readouterr().err
