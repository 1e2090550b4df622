"""Submitting with `gpc` and the Python client: spec files checked whole before anything is submitted,
`--wait` exiting with the workload's own exit code, retries that never submit twice."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from gpucloud_client import Client, Context

from jobs.models import Workload
from tests.accounting.budget_factories import budget
from tests.client.conftest import Platform

pytestmark = pytest.mark.django_db(transaction=True)

IMAGE = "registry.example.com/team/train:1.0"

BROKEN_SPEC = f"""\
# a sweep with a mistake in two of its three workloads
name: prep
image: {IMAGE}
pool: shared
command: ["sh", "-c", "echo prep"]
---
name: Bad_Name!
image: {IMAGE}
pool: shared
gpus_per_replica: 99
---
name: sweep-2
image: {IMAGE}
pool: shared
gpu_model: [H100]
replicas: 0
"""

VALID_SPEC = f"""\
name: prep
image: {IMAGE}
pool: shared
command: ["sh", "-c", "echo prep"]
---
name: sweep-1
image: {IMAGE}
pool: shared
command: "sh -c 'echo one'"
env:
  LEARNING_RATE: "0.1"
shm_mib: 1024
"""


SWEEP_SPEC = f"""\
name: fine
image: {IMAGE}
pool: shared
command: ["sh", "-c", "sleep 1"]
---
name: broken
image: {IMAGE}
pool: shared
command: ["sh", "-c", "sleep 1; exit 3"]
"""


def _issues(stderr: str) -> dict[tuple[int, str], str]:
    """Return {(line, field): rule} of every `spec.yaml:LINE (document N) FIELD: RULE: message` printed."""
    found = re.findall(r"spec\.yaml:(\d+)(?::\d+)? \(document \d\) ([\w.\[\]]+): (\w+):", stderr)
    return {(int(line), field): rule for line, field, rule in found}


def test_a_spec_with_errors_in_several_documents_names_them_all_at_their_lines_and_submits_nothing(
    platform: Platform, tmp_path: Path
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(BROKEN_SPEC)
    done = platform.member("submit", "-f", str(spec))
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith("error: "), done.stderr
    issues = _issues(done.stderr)
    assert issues.get((7, "name")) == "invalid_name", done.stderr  # the API's rules...
    assert (10, "gpus_per_replica") in issues, done.stderr
    assert issues.get((15, "gpu_model")) == "unknown_field", done.stderr  # ...and the file's own, at once
    assert "did you mean 'gpu_models'?" in done.stderr
    assert (16, "replicas") in issues, done.stderr
    assert not Workload.all_tenants.exists()

    dry = platform.member("submit", "--dry-run", "-f", str(spec))
    assert dry.returncode == 3 and not Workload.all_tenants.exists()


def test_a_valid_spec_submits_every_document_and_lists_them(platform: Platform, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(VALID_SPEC)
    dry = platform.member("submit", "--dry-run", "-f", str(spec))
    assert dry.returncode == 0, dry.stderr
    assert not Workload.all_tenants.exists(), "a dry run writes nothing"

    done = platform.member("-o", "json", "submit", "-f", str(spec))
    assert done.returncode == 0, done.stderr
    submitted = json.loads(done.stdout)
    assert [w["name"] for w in submitted] == ["prep", "sweep-1"]
    assert [w["project"] for w in submitted] == ["alpha", "alpha"]
    stored = Workload.all_tenants.get(pk=submitted[1]["id"])
    assert stored.command == ["sh", "-c", "echo one"] and stored.env == {"LEARNING_RATE": "0.1"}
    assert (stored.shm_mib, Workload.all_tenants.get(pk=submitted[0]["id"]).shm_mib) == (1024, None)
    assert Workload.all_tenants.count() == 2


def test_a_dry_run_and_a_spec_file_say_how_much_of_the_budget_the_work_may_use(
    platform: Platform, tmp_path: Path
) -> None:
    budget(platform.world.tenant_a, platform.world.project_a, amount="40")
    dry = platform.member(
        "submit", "--image", IMAGE, "--pool", "shared", "--max-runtime", "7200", "--dry-run", "train", "--", "true"
    )
    assert dry.returncode == 0, dry.stderr
    assert "This job may use up to 2.0 of your remaining 40.0 GPU-hours (project alpha's budget this month)" in (
        dry.stderr
    )
    spec = tmp_path / "spec.yaml"
    spec.write_text(VALID_SPEC)
    done = platform.member("submit", "--dry-run", "-f", str(spec))
    assert done.returncode == 0, done.stderr
    # Neither document has a runtime limit, nor does the quota: together they may use all that remains.
    assert "alpha: These 2 workloads have no runtime limit: they may use all of your remaining 40.0" in done.stderr
    assert not Workload.all_tenants.exists()


def test_submit_wait_follows_a_job_to_its_end_and_exits_with_its_exit_code(platform: Platform) -> None:
    gpc = platform.member
    ok = gpc("submit", "--image", IMAGE, "--pool", "shared", "--wait", "one-second", "--", "sh", "-c", "sleep 1")
    assert ok.returncode == 0, ok.stderr
    assert re.search(r"one-second: succeeded", ok.stderr), ok.stderr
    failing = gpc("submit", "--image", IMAGE, "--pool", "shared", "--wait", "seven", "--", "sh", "-c", "exit 7")
    assert failing.returncode == 7, failing.stderr
    assert "seven: failed (exit code 7)" in failing.stderr
    states = dict(Workload.all_tenants.values_list("name", "state"))
    assert states == {"one-second": "succeeded", "seven": "failed"}


def test_a_retried_submission_with_the_same_idempotency_key_makes_one_workload(platform: Platform) -> None:
    gpc = platform.member
    argv = (
        "-o",
        "json",
        "submit",
        "--image",
        IMAGE,
        "--pool",
        "shared",
        "--idempotency-key",
        "retry-1",
        "once",
        "--",
        "true",
    )
    first, again = gpc(*argv), gpc(*argv)
    assert first.returncode == again.returncode == 0, first.stderr + again.stderr
    assert json.loads(first.stdout)["id"] == json.loads(again.stdout)["id"]

    context = Context(name="py", url=platform.url, token=platform.member_token, tenant="tenant-a", project="alpha")
    with Client(context) as client:
        body = {"name": "twice", "image": IMAGE, "pool": "shared", "command": ["sh", "-c", "echo hi"]}
        made = client.submit(body, idempotency_key="retry-2")
        replayed = client.submit(body, idempotency_key="retry-2")
        assert made.id == replayed.id
        assert client.submit(body).id != made.id, "a new key is a new submission"
    assert sorted(Workload.all_tenants.values_list("name", flat=True)) == ["once", "twice", "twice"]


def test_submit_file_wait_follows_every_workload_and_exits_with_the_first_failing_code(
    platform: Platform, tmp_path: Path
) -> None:
    spec = tmp_path / "sweep.yaml"
    spec.write_text(SWEEP_SPEC)
    done = platform.member("-o", "json", "submit", "--wait", "-f", str(spec))
    assert done.returncode == 3, done.stderr
    finals = json.loads(done.stdout)
    assert [(w["name"], w["state"], w["exit_code"]) for w in finals] == [
        ("fine", "succeeded", 0),
        ("broken", "failed", 3),
    ]
    assert "broken: failed (exit code 3)" in done.stderr


def test_submit_wait_logs_prints_the_jobs_output_while_it_runs(platform: Platform) -> None:
    script = "for i in 1 2 3; do echo step-$i; sleep 0.3; done"
    argv = ("submit", "--image", IMAGE, "--pool", "shared", "--wait", "--logs", "talker", "--", "sh", "-c", script)
    done = platform.member(*argv)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["step-1", "step-2", "step-3"]


@pytest.mark.parametrize("mode", [[], ["--async"]], ids=["sync", "async"])
def test_the_sweep_example_submits_20_jobs_waits_for_all_and_exits_with_the_first_failures_code(
    platform: Platform, mode: list[str]
) -> None:
    """client/examples/sweep.py as its docs run it, logged in through `gpc login` (the member's contexts file)."""
    example = Path(__file__).resolve().parents[2] / "client" / "examples" / "sweep.py"
    command = "sh -c 'echo lr={lr}; test {index} -ne 13 || exit 4'"  # job 13 fails with exit code 4
    argv = [sys.executable, str(example), "--image", IMAGE, "--pool", "shared", "--gpus", "0", "--command", command]
    done = subprocess.run(
        [*argv, *mode], capture_output=True, text=True, timeout=240, env=platform.member.env(), check=False
    )
    platform.member.check_secrets(done.stdout + done.stderr)
    assert done.returncode == 4, done.stderr
    rows = [line.split("\t") for line in done.stdout.splitlines()]
    assert [row[1] for row in rows] == [f"sweep-{index:02d}" for index in range(20)]
    assert [row[2] for row in rows] == ["failed" if index == 13 else "succeeded" for index in range(20)], rows
    assert rows[13][3] == "exit 4"
    jobs = Workload.all_tenants.filter(name__startswith="sweep-").order_by("name")
    assert jobs.count() == 20 and {job.env["SWEEP_INDEX"] for job in jobs} == {str(i) for i in range(20)}
    assert jobs[0].command[-1].startswith("echo lr=1.00e-01")
