"""`gpucloud simulate` is the scheduler simulator, reachable from the console script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucloud.cli import main
from tests.conftest import TRACES

PHILLY = TRACES / "philly-derived"

pytestmark = pytest.mark.traces


def test_simulate_replays_a_trace_and_writes_the_metrics(tmp_path: Path) -> None:
    out = tmp_path / "metrics.json"
    argv = ["simulate", "--trace", str(PHILLY), "--gpus", "32", "--limit-jobs", "40", "--json", str(out)]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 0
    metrics = json.loads(out.read_text())
    assert metrics["quota_violations"] == 0
    assert {"mean_jct_s", "p95_jct_s", "mean_wait_s", "p95_wait_s", "jain_index", "gpu_allocation_mean"} <= set(metrics)


def test_simulate_rejects_a_bad_policy(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["simulate", "--trace", str(PHILLY), "--gpus", "8", "--policy", "lottery"])
    assert exited.value.code == 2
    assert "--policy" in capsys.readouterr().err
