"""The simulator on small slices of the real traces (../shared/data/traces/), loaders and checks included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.scheduler.core import Ordering, ReplicaAllocation, Snapshot, TenantQuota, Workload
from jobs.scheduler.simulator import cli, traces
from jobs.scheduler.simulator.build import default_quotas, gpu_hour_shares
from jobs.scheduler.simulator.engine import Settings, simulate
from jobs.scheduler.simulator.metrics import check_quotas, percentile
from tests.conftest import TRACES

PHILLY = TRACES / "philly-derived"
ALIBABA = TRACES / "alibaba-gpu-v2023"


def run(trace: traces.Trace, ordering: Ordering) -> dict:
    capacity = sum(node.gpus for node in trace.nodes)
    tenant_quotas, project_quotas = default_quotas(gpu_hour_shares(trace.jobs), capacity)
    return simulate(trace, Settings(ordering, tenant_quotas, project_quotas)).summary


@pytest.mark.parametrize(("gpus", "shape"), [(1, (1, 1)), (8, (8, 1)), (12, (6, 2)), (16, (8, 2)), (20, (5, 4))])
def test_gangs_are_the_fewest_equal_replicas_of_at_most_8(gpus: int, shape: tuple[int, int]) -> None:
    assert traces.gang_shape(gpus) == shape


def test_missing_throughput_scales_the_single_gpu_entry() -> None:
    table = {repr(("A3C", 1)): {"null": 2.5}, repr(("A3C", 2)): {"null": 4.0}}
    assert traces.philly_throughput(table, "A3C", 2) == 4.0
    assert traces.philly_throughput(table, "A3C", 4) == 10.0


def test_default_guarantees_follow_gpu_hours_and_sum_to_the_cluster() -> None:
    tenant_quotas, project_quotas = default_quotas({"a": 0.5, "b": 0.3, "c": 0.2}, 7)
    assert [(q.tenant, q.guaranteed, q.limit) for q in tenant_quotas] == [("a", 4, 7), ("b", 2, 7), ("c", 1, 7)]
    assert sum(q.guaranteed for q in project_quotas) == 7


@pytest.mark.traces
def test_alibaba_nodes_sample_evenly_to_about_the_asked_size() -> None:
    nodes = traces.alibaba_nodes(ALIBABA, 512)
    assert 460 <= sum(n.gpus for n in nodes) <= 560
    assert len({n.model for n in nodes}) >= 4  # evenly spread over the list, not its first models only
    assert sum(n.gpus for n in traces.alibaba_nodes(ALIBABA)) == 6212


@pytest.mark.traces
def test_alibaba_pods_hash_to_ten_tenants_and_count_fractions_as_one_gpu() -> None:
    pods = traces.alibaba_pods(ALIBABA / "openb_pod_list_default.csv")
    assert len(pods) == 8152
    assert len({p.tenant for p in pods}) == 10
    assert {p.gpus for p in pods} == {0, 1, 2, 4, 8}
    assert pods[1].id == "openb-pod-0001" and pods[1].gpus == 1  # asks 460 milli-GPU


@pytest.mark.traces
def test_philly_slice_both_policies_finish_everything_without_violations() -> None:
    trace = traces.load_philly(PHILLY, 64, limit_jobs=400)
    fair, fifo = run(trace, Ordering.FAIRSHARE), run(trace, Ordering.FIFO)
    for summary in (fair, fifo):
        assert summary["finished"] == 400 and summary["unfinished"] == 0
        assert summary["quota_violations"] == 0
        assert 0 < summary["gpu_allocation_mean"] <= 1
        assert 0 < summary["jain_index"] <= 1
        assert summary["p50_jct_s"] <= summary["p95_jct_s"]
    assert fifo["preemptions"] == 0
    assert fair["mean_wait_s"] < fifo["mean_wait_s"]


@pytest.mark.traces
def test_a_simulation_is_deterministic() -> None:
    trace = traces.load_philly(PHILLY, 32, limit_jobs=150)
    assert run(trace, Ordering.FAIRSHARE) == run(trace, Ordering.FAIRSHARE)


@pytest.mark.traces
def test_alibaba_slice_places_cpu_only_and_constrained_pods() -> None:
    trace = traces.load_alibaba(ALIBABA, 256, limit_jobs=300)
    assert any(j.gpus == 0 for j in trace.jobs)
    summary = run(trace, Ordering.FAIRSHARE)
    assert summary["finished"] + summary["unfinished"] == 300
    assert summary["finished"] >= 290
    assert summary["quota_violations"] == 0


def test_the_quota_check_counts_limits_and_double_allocations() -> None:
    def holding(wid: str, tenant: str, *uuids: str) -> Workload:
        return Workload(wid, tenant, tenant, "p", 0.0, gpus=len(uuids), allocation=(ReplicaAllocation("n", uuids),))

    quotas = (TenantQuota("a", "p", 1, 2), TenantQuota("b", "p", 1, 1))
    snapshot = Snapshot(0.0, (), (), quotas)
    assert check_quotas(snapshot, [holding("1", "a", "g0", "g1"), holding("2", "b", "g2")], quotas) == 0
    assert check_quotas(snapshot, [holding("1", "a", "g0", "g1"), holding("2", "b", "g2", "g3")], quotas) == 1
    assert check_quotas(snapshot, [holding("1", "a", "g0"), holding("2", "b", "g0")], quotas) == 1


def test_percentile_is_nearest_rank() -> None:
    assert percentile([float(v) for v in range(1, 101)], 0.95) == 95.0
    assert percentile([3.0], 0.5) == 3.0
    assert percentile([], 0.5) == 0.0


@pytest.mark.traces
def test_cli_writes_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "m.json", tmp_path / "m.png"
    argv = ["--trace", str(PHILLY), "--gpus", "32", "--policy", "fifo", "--limit-jobs", "60"]
    assert cli.main([*argv, "--json", str(out), "--plot", str(png)]) == 0
    summary = json.loads(out.read_text())
    for key in ("mean_jct_s", "p95_jct_s", "mean_wait_s", "p95_wait_s", "jain_index", "preemptions"):
        assert key in summary
    assert summary["quota_violations"] == 0 and 0 <= summary["gpu_allocation_mean"] <= 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(capsys.readouterr().out) == summary


@pytest.mark.traces
def test_cli_refuses_a_folder_without_a_trace(tmp_path: Path) -> None:
    assert cli.main(["--trace", str(tmp_path), "--gpus", "8"]) == 2
    assert cli.main(["--trace", str(PHILLY), "--gpus", "8", "--quota", "broken"]) == 2
