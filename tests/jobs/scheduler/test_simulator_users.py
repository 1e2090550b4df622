"""What the simulator assumes users do and what it learns: limit and checkpoint draws, predictions, decayed usage,
start-estimate error, and the keys of its JSON; each on a case whose right answer is known."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from jobs.scheduler.core import Decisions, Estimate, Ordering, ProjectQuota, Snapshot, TenantQuota, Workload
from jobs.scheduler.simulator import cli
from jobs.scheduler.simulator.build import POOL
from jobs.scheduler.simulator.engine import Settings, Simulation
from jobs.scheduler.simulator.predictor import RuntimePredictor
from jobs.scheduler.simulator.traces import Trace, TraceJob, TraceNode
from jobs.scheduler.simulator.usage import UsageBooks
from jobs.scheduler.simulator.users import DEFAULT_MAX_RUNTIME_S, CheckpointMix, LimitModel

TENANTS = (TenantQuota("t", POOL, 1, 1, 1.0),)
PROJECTS = (ProjectQuota("t", "t", POOL, 1, 1, 1.0),)
ONE_GPU = TraceNode("n0", 1, "V100", 64_000, 512_000)
IDS = [f"team-{i}" for i in range(4_000)]


def test_a_limit_draw_is_reproducible_and_within_its_documented_range() -> None:
    model = LimitModel()
    draws = [model.draw(job, 3_600.0) for job in IDS]
    assert draws == [model.draw(job, 3_600.0) for job in IDS]
    at_max = sum(d == DEFAULT_MAX_RUNTIME_S for d in draws) / len(draws)
    assert 0.15 <= at_max <= 0.19  # 17 % ask for the pool's maximum
    factors = [d / 3_600.0 for d in draws if d != DEFAULT_MAX_RUNTIME_S]
    assert min(factors) >= 1.5
    assert max(factors) <= 10.0
    # Log-uniform: the median factor is near sqrt(1.5 x 10) = 3.87.
    assert 3.5 <= sorted(factors)[len(factors) // 2] <= 4.3
    assert [model.draw(job, 3_600.0, seed=1) for job in IDS[:50]] != draws[:50]


def test_a_limit_is_never_above_the_pool_maximum() -> None:
    model = LimitModel(max_runtime_s=7_200.0)
    assert all(model.draw(job, 5_000.0) <= 7_200.0 for job in IDS[:500])
    assert all(model.draw(job, 9_000.0) == 7_200.0 for job in IDS[:500])  # such a job is killed at its limit


def test_the_checkpoint_mix_is_reproducible_and_as_documented() -> None:
    mix = CheckpointMix()
    draws = [mix.draw(job) for job in IDS]
    assert draws == [mix.draw(job) for job in IDS]
    assert set(draws) == {0.0, 900.0, 1_800.0, 3_600.0}
    assert 0.37 <= sum(d > 0 for d in draws) / len(draws) <= 0.43
    assert [mix.draw(job, seed=7) for job in IDS[:50]] != draws[:50]
    assert all(CheckpointMix(share=0.0).draw(job) == 0.0 for job in IDS[:100])


def job(job_id: str, at: float, run_s: float, image: str = "x", gpus: int = 1, tenant: str = "t") -> TraceJob:
    return TraceJob(job_id, tenant, at, run_s, gpus, image=image, limit_s=10 * run_s)


def test_the_predictor_takes_the_median_of_similar_work_by_the_products_rule() -> None:
    predictor = RuntimePredictor(recent=3, min_runs=3)
    assert predictor.predict(job("a", 0, 1)) is None
    for run_s in (100.0, 300.0, 200.0, 900.0):
        predictor.observe(job("done", 0, run_s), run_s)
    assert predictor.predict(job("a", 0, 1)) == 300.0  # median of the latest three: 300, 200, 900
    assert predictor.predict(job("b", 0, 1, image="other")) == 300.0  # no such image: the project and shape
    assert predictor.predict(job("c", 0, 1, gpus=2)) is None
    assert predictor.predict(job("d", 0, 1, tenant="u")) is None
    # One run of image y is fewer than 3: the broader group's latest three (200, 900, 50) decide.
    predictor.observe(job("y1", 0, 50.0, image="y"), 50.0)
    assert predictor.predict(job("e", 0, 1, image="y")) == 200.0


def test_with_too_little_history_anywhere_the_most_specific_group_decides() -> None:
    predictor = RuntimePredictor(recent=20, min_runs=3)
    predictor.observe(job("y1", 0, 50.0, image="y"), 50.0)
    predictor.observe(job("z1", 0, 70.0, image="z"), 70.0)
    assert predictor.predict(job("e", 0, 1, image="y")) == 50.0
    assert predictor.predict(job("f", 0, 1, image="w")) == 60.0  # the project and shape: median of 50 and 70


class Spy(Simulation):
    """Keeps every snapshot the core was given."""

    def __init__(self, trace: Trace, settings: Settings) -> None:
        super().__init__(trace, settings)
        self.snapshots: list[Snapshot] = []

    def decide(self, snapshot: Snapshot) -> Decisions:
        self.snapshots.append(snapshot)
        return super().decide(snapshot)


def test_a_waiting_job_gets_a_prediction_once_similar_work_completes_and_the_error_is_scored() -> None:
    # One GPU. J1 (100 s) runs from 0; J2 (50 s, same tenant, image and size) waits from 1 s. At 100 s J1
    # completes, J2's prediction becomes 100 s and it starts: error |100 - 50| / 50 = 1. J1 had none.
    trace = Trace("predict", (ONE_GPU,), (job("J1", 0.0, 100.0), job("J2", 1.0, 50.0)))
    spy = Spy(trace, Settings(Ordering.FIFO, TENANTS, PROJECTS, checkpoints=None))
    spy.skip_stalled_fifo = False
    summary = spy.run().summary
    by_time = {s.now: {w.id: w.predicted_s for w in s.pending} for s in spy.snapshots}
    assert by_time == {0.0: {"J1": None}, 1.0: {"J2": None}, 100.0: {"J2": 100.0}}
    assert (summary["prediction_error_p50"], summary["predicted_share"]) == (1.0, 0.5)


def test_a_job_killed_at_its_limit_teaches_the_predictor_nothing() -> None:
    killed = replace(job("J1", 0.0, 100.0), limit_s=60.0)
    trace = Trace("censored", (ONE_GPU,), (killed, job("J2", 1.0, 50.0)))
    spy = Spy(trace, Settings(Ordering.FIFO, TENANTS, PROJECTS, checkpoints=None))
    summary = spy.run().summary
    assert summary["killed_at_limit"] == 1
    assert all(w.predicted_s is None for s in spy.snapshots for w in s.pending)
    assert summary["prediction_error_p50"] is None and summary["predicted_share"] == 0.0


def test_the_core_reads_limits_and_predictions_never_the_true_run_time() -> None:
    # The same trace with other true run times gives the core the same first snapshot.
    trace = Trace("blind", (ONE_GPU,), (replace(job("J1", 0.0, 100.0), limit_s=None),))
    firsts = []
    for run_s in (100.0, 5_000.0):
        changed = replace(trace, jobs=(replace(trace.jobs[0], duration_s=run_s),))
        spy = Spy(changed, Settings(Ordering.FAIRSHARE, TENANTS, PROJECTS, limits=LimitModel(max_runtime_s=50.0)))
        spy.run()
        firsts.append(spy.snapshots[0].pending)
    assert firsts[0] == firsts[1]
    assert firsts[0][0].limit_s == 50.0 and firsts[0][0].predicted_s is None


def test_decayed_usage_halves_after_one_half_life() -> None:
    half_life = 1_000.0
    books = UsageBooks(half_life)
    work = Workload("w", "t", "p", POOL, 0.0, gpus=4)
    books.started(work, 0.0)
    # While it runs: 4 GPUs x h / ln 2 x (1 - 2^(-t/h)); after 100 s nearly 400 GPU-seconds.
    assert books.gpu_seconds((POOL, "t", None), 100.0) == pytest.approx(4 * half_life / math.log(2) * (1 - 2**-0.1))
    books.stopped(work, 100.0)
    at_stop = books.gpu_seconds((POOL, "t", "p"), 100.0)
    assert books.gpu_seconds((POOL, "t", "p"), 1_100.0) == pytest.approx(at_stop / 2)
    usage = {(u.tenant, u.project): u.gpu_seconds for u in books.snapshot(1_100.0)}
    assert usage == {("t", None): pytest.approx(at_stop / 2), ("t", "p"): pytest.approx(at_stop / 2)}
    assert books.gpu_seconds((POOL, "t", None), 2_100.0) == pytest.approx(at_stop / 4)


def test_the_simulation_passes_decayed_usage_of_running_work_to_the_core() -> None:
    trace = Trace("usage", (ONE_GPU,), (job("J1", 0.0, 100.0), job("J2", 10.0, 50.0)))
    spy = Spy(trace, Settings(Ordering.FAIRSHARE, TENANTS, PROJECTS, decay_half_life_s=1e12))
    spy.run()
    at_ten = next(s for s in spy.snapshots if s.now == 10.0)
    assert {(u.tenant, u.project): round(u.gpu_seconds, 3) for u in at_ten.usage} == {
        ("t", None): 10.0,
        ("t", "t"): 10.0,
    }


class Estimating(Simulation):
    """The core's decisions, with a start estimate per waiting job: `first` at its first pass, a wild one after."""

    def __init__(self, trace: Trace, settings: Settings, first: dict[str, float] | None) -> None:
        super().__init__(trace, settings)
        self.first = first
        self.seen: set[str] = set()

    def decide(self, snapshot: Snapshot) -> Decisions:
        decisions = super().decide(snapshot)
        if self.first is None:
            return replace(decisions, estimates={})
        estimates = {}
        for w in snapshot.pending:
            at = self.first[w.id] if w.id not in self.seen else snapshot.now + 10_000.0
            estimates[w.id] = Estimate(at, "stub")
            self.seen.add(w.id)
        return replace(decisions, estimates=estimates)


# One GPU, FIFO. J1 runs 0-100 s; J2 (from 10 s) starts at 100 s; J3 (from 20 s) at 150 s.
ETA_TRACE = Trace("eta", (ONE_GPU,), (job("J1", 0.0, 100.0), job("J2", 10.0, 50.0), job("J3", 20.0, 10.0)))


def test_the_eta_error_compares_the_first_estimate_with_the_actual_start() -> None:
    # J2 first estimated at 80 s: |80 - 100| / (100 - 10) = 0.2222; J3 at 200 s: |200 - 150| / 130 = 0.3846.
    # J1 never waited. Nearest rank: p50 is the smaller, p90 the larger.
    first = {"J1": 0.0, "J2": 80.0, "J3": 200.0}
    settings = Settings(Ordering.FIFO, TENANTS, PROJECTS, checkpoints=None, estimates=True)
    summary = Estimating(ETA_TRACE, settings, first).run().summary
    assert (summary["eta_error_p50"], summary["eta_error_p90"]) == (round(20 / 90, 4), round(50 / 130, 4))
    assert (summary["eta_miss_p50_s"], summary["eta_miss_p90_s"]) == (20.0, 50.0)
    assert summary["eta_share"] == 1.0


def test_without_estimates_from_the_core_the_eta_error_is_null() -> None:
    settings = Settings(Ordering.FIFO, TENANTS, PROJECTS, checkpoints=None, estimates=True)
    summary = Estimating(ETA_TRACE, settings, None).run().summary
    assert summary["eta_error_p50"] is None and summary["eta_error_p90"] is None


def test_estimates_are_asked_of_the_core_only_when_measured() -> None:
    for measured in (False, True):
        spy = Spy(ETA_TRACE, Settings(Ordering.FIFO, TENANTS, PROJECTS, estimates=measured))
        spy.run()
        assert {s.config.estimates for s in spy.snapshots} == {measured}


REQUIRED = (
    "mean_jct_s",
    "p95_jct_s",
    "mean_wait_s",
    "jain_index",
    "preemption_lost_gpu_hours",
    "submitted_gpu_hours",
    "max_preemptions_one_job",
    "wait_by_size",
    "eta_error_p50",
    "eta_error_p90",
    "quota_violations",
    "unfinished",
    "killed_at_limit",
    "prediction_error_p50",
    "predicted_share",
    "assumptions",
)


@pytest.mark.parametrize("policy", [o.value for o in Ordering])
def test_the_json_has_every_key_and_says_what_was_assumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy: str
) -> None:
    folder = tmp_path / "trace"
    folder.mkdir()
    row = "T\tpython3 train.py\t-n\t1\t{steps}\t{at}\t{gpus}\n"
    (folder / "a.trace").write_text(row.format(steps=3_600, at=0, gpus=1) + row.format(steps=600, at=5, gpus=16))
    (folder / "b.trace").write_text(row.format(steps=1_800, at=1, gpus=4))
    throughputs = {repr(("T", g)): {"null": 1.0} for g in (1, 4, 16)}
    (folder / "simulation_throughputs.json").write_text(json.dumps({"v100": throughputs}))
    argv = ["--trace", str(folder), "--gpus", "16", "--policy", policy, "--eta", "--seed", "3"]
    assert cli.main(argv) == 0
    summary: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert [key for key in REQUIRED if key not in summary] == []
    assert set(summary["wait_by_size"]) == {"1", "2-8", ">8"}
    assumed = summary["assumptions"]
    assert assumed["policy"] == policy and assumed["seed"] == 3
    assert assumed["time_limits"]["max_runtime_s"] == DEFAULT_MAX_RUNTIME_S
    assert assumed["checkpoints"] == {"model": "mix", "share": 0.4, "intervals_s": [900.0, 1_800.0, 3_600.0]}
    assert assumed["usage_half_life_s"] == 7 * 86_400.0
    assert summary["submitted_gpu_hours"] == round((3_600 + 16 * 600 + 4 * 1_800) / 3_600, 1)


def test_the_cli_says_no_job_checkpoints_and_refuses_bad_combinations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "trace"
    folder.mkdir()
    (folder / "a.trace").write_text("T\tx\t-n\t1\t100\t0\t1\n")
    (folder / "simulation_throughputs.json").write_text(json.dumps({"v100": {repr(("T", 1)): {"null": 1.0}}}))
    assert cli.main(["--trace", str(folder), "--gpus", "8", "--no-checkpoints"]) == 0
    assert json.loads(capsys.readouterr().out)["assumptions"]["checkpoints"] == "none"
    assert cli.main(["--gpus", "8"]) == 2
    assert cli.main(["--trace", str(folder), "--gpus", "8", "--from-console"]) == 2
    assert cli.main(["--trace", str(folder), "--gpus", "8", "--max-runtime", "0"]) == 2
    assert cli.main(["--trace", str(folder), "--gpus", "8", "--decay-half-life", "-1"]) == 2
