"""Looking after workloads with `gpc`: `ls` (a table and JSON), `describe` of one that waits, `cancel`, `restart`."""

from __future__ import annotations

import json

import pytest

from jobs.choices import WorkloadState
from jobs.models import Workload
from tests.client.conftest import GPUS, Platform, reached
from tests.workers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

IMAGE = "registry.example.com/team/train:1.0"


def _submit(platform: Platform, name: str, gpus: int, *command: str) -> int:
    done = platform.member(
        "-o", "json", "submit", "--image", IMAGE, "--pool", "shared", "--gpus", str(gpus), name, "--", *command
    )
    assert done.returncode == 0, done.stderr
    workload_id: int = json.loads(done.stdout)["id"]
    return workload_id


def _row(table: str, workload_id: int) -> list[str]:
    """Return the cells of the `ls` table's row of `workload_id` (split on runs of spaces)."""
    for line in table.splitlines():
        cells = line.split()
        if cells and cells[0] == str(workload_id):
            return cells
    raise AssertionError(f"no row {workload_id} in:\n{table}")


def test_ls_describe_cancel_and_restart_show_what_happens_to_a_workload_that_waits(platform: Platform) -> None:
    gpc = platform.member
    blocker = _submit(platform, "blocker", 1, "sh", "-c", "sleep 60")
    reached(blocker, WorkloadState.RUNNING)
    waiter = _submit(platform, "waiter", GPUS, "sh", "-c", "echo done")  # every GPU of the node: one is taken
    assert wait_until(lambda: Workload.all_tenants.get(pk=waiter).reason_hint), "the scheduler said why it waits"
    waiting = Workload.all_tenants.get(pk=waiter)
    assert waiting.state == WorkloadState.PENDING

    table = gpc("ls")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split()[:3] == ["ID", "NAME", "KIND"]
    assert _row(table.stdout, blocker)[1:6] == ["blocker", "job", "alpha", "member_a", "running"]
    assert _row(table.stdout, waiter)[1:6] == ["waiter", "job", "alpha", "member_a", "pending"]
    listed = {w["id"]: w for w in json.loads(gpc("-o", "json", "ls").stdout)}
    assert set(listed) == {blocker, waiter}
    assert listed[waiter]["state"] == "pending" and listed[waiter]["queue_position"] == 1
    assert listed[waiter]["reason_code"] == waiting.reason_code

    only = json.loads(gpc("-o", "json", "ls", "--state", "pending").stdout)
    assert [w["id"] for w in only] == [waiter]

    described = gpc("describe", str(waiter))
    assert described.returncode == 0, described.stderr
    lines = {line.split("  ", 1)[0]: line.rstrip() for line in described.stdout.splitlines() if line.strip()}
    assert "pending" in lines["State"]
    assert waiting.reason_code in lines["Reason"] and waiting.reason_message in lines["Reason"]
    assert lines["Queue position"].split()[-1] == "1"
    assert lines["Hint"].split(None, 1)[1] == waiting.reason_hint == "would start now with 1 GPU"
    assert lines["Actions"].split() == ["Actions", "cancel"], "what the API's `actions` says of it"
    assert "Events" in described.stdout

    cancelled = gpc("cancel", str(blocker))
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"cancelled {blocker} (blocker)" in cancelled.stderr
    reached(blocker, WorkloadState.CANCELLED)
    reached(waiter, WorkloadState.SUCCEEDED)  # the GPUs it waited for are free
    again = gpc("cancel", str(blocker))
    assert again.returncode == 6, again.stderr
    assert "error: Workload blocker is cancelled" in again.stderr, "the API's words, naming the rule broken"
    assert gpc("ls").stdout.strip().splitlines()[1:] == [], "ended workloads leave the default list"
    everything = gpc("ls", "--all").stdout
    assert _row(everything, blocker)[5] == "cancelled" and _row(everything, waiter)[5] == "succeeded"

    restarted = gpc("-o", "json", "restart", str(blocker))
    assert restarted.returncode == 0, restarted.stderr
    assert json.loads(restarted.stdout)["state"] in {"pending", "scheduled", "starting", "running"}
    second = reached(blocker, WorkloadState.RUNNING)
    assert second.attempt == 2
    assert gpc("cancel", str(blocker)).returncode == 0
    assert reached(blocker, WorkloadState.CANCELLED).attempt == 2
    assert Workload.all_tenants.count() == 2
