"""What `gpc` prints: tables for people, the API's objects exactly for scripts, `--help` everywhere and fast.

Canned API answers (MockTransport) only feed the formatting under test; the commands working against a
console are tests/client/'s.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import httpx
import pytest
import yaml
from click.testing import CliRunner
from rich.console import Console, RenderableType

from gpucloud_client.cli.describe import describe_view
from gpucloud_client.cli.logs import LinePrinter
from gpucloud_client.cli.main import cli
from gpucloud_client.cli.output import ago, dump, size, text, until
from gpucloud_client.cli.quota import quota_table, usage_table
from gpucloud_client.cli.state import AppState
from gpucloud_client.cli.submit import flags_body
from gpucloud_client.cli.top_live import TopModel, utilization_bar
from gpucloud_client.cli.workloads import workloads_table
from gpucloud_client.models import GpuBatch, LogLine, Quota, QuotaUse, Workload, WorkloadDetail

TOKEN = "gpc_0123456789ab_abcdefghijklmnopqrstuvwxyz012345"
WORKLOADS = [
    {
        "id": 12,
        "name": "train-b",
        "kind": "job",
        "state": "pending",
        "project": "vision",
        "owner": "ada",
        "gpus_per_replica": 2,
        "replicas": 4,
        "queue_position": 3,
        "reason_code": "QUOTA_EXCEEDED",
        "submitted_at": "2026-01-01T00:00:00Z",
        "a_field_a_newer_console_added": {"kept": True},
    },
    {"id": 11, "name": "nb", "kind": "notebook", "state": "running", "project": "vision", "owner": "bob"},
]
DETAIL = {
    **WORKLOADS[0],
    "pool": "a100",
    "image": "pytorch/pytorch:2.4",
    "command": ["python", "train.py", "--note", "two words"],
    "reason_message": "The project's quota in pool a100 is in use.",
    "reason_hint": "Wait, or ask an admin to raise the limit.",
    "cpu_milli": 1500,
    "memory_mib": 8192,
    "allocations": [],
    "events": [{"kind": "workload.submitted", "from_state": "", "to_state": "pending", "message": "Submitted by ada."}],
    "launch_steps": [
        {"key": "queued", "label": "Queued", "detail": "", "status": "done"},
        {"key": "placed", "label": "Placed on a node", "detail": "waiting for quota", "status": "current"},
        {"key": "image", "label": "Image pulled", "detail": "", "status": "next"},
    ],
    "actions": ["cancel"],
}


def rendered(renderable: RenderableType) -> str:
    """Return what a renderable looks like on a 200-column terminal without colours."""
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(renderable)
    return out.getvalue()


@pytest.fixture
def canned(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> AppState:
    """An AppState whose console answers the workload list and one workload with the objects above."""
    monkeypatch.setenv("GPUCLOUD_CONFIG", str(tmp_path / "config.yaml"))
    monkeypatch.setenv("GPUCLOUD_URL", "http://console.test")
    monkeypatch.setenv("GPUCLOUD_TOKEN", TOKEN)
    monkeypatch.setenv("GPUCLOUD_TENANT", "acme")
    # Off a terminal the table is COLUMNS wide: pinned, whatever the worker process inherited.
    monkeypatch.setenv("COLUMNS", "200")

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/workloads/12/"):
            return httpx.Response(200, json=DETAIL)
        state = request.url.params.get("state")
        rows = [w for w in WORKLOADS if state in (None, w["state"])]
        return httpx.Response(200, json={"count": len(rows), "next": None, "previous": None, "results": rows})

    return AppState(transport=httpx.MockTransport(answer), client_options={"retries": 0})


def every_command(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, command in group.commands.items():
        yield (*prefix, name)
        if isinstance(command, click.Group):
            yield from every_command(command, (*prefix, name))


@pytest.mark.parametrize("path", [(), *every_command(cli)], ids=lambda path: " ".join(path) or "gpc")
def test_every_command_has_help(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"])

    assert result.exit_code == 0
    assert result.stdout.startswith(f"Usage: cli {' '.join(path)}".rstrip())
    assert len(result.stdout.splitlines()) > 3


def test_help_imports_only_click_and_the_standard_library() -> None:
    script = "import sys, json\nfrom gpucloud_client.cli.main import cli\nprint(json.dumps(sorted(sys.modules)))"
    loaded = set(json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, check=True).stdout))

    assert not {"httpx", "websockets", "yaml", "rich", "asyncio", "gpucloud_client.client"} & loaded


def test_ls_table_shows_not_ended_workloads_newest_first(canned: AppState) -> None:
    result = CliRunner().invoke(cli, ["ls"], obj=canned)

    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    assert header.split() == [
        "ID", "NAME", "KIND", "PROJECT", "OWNER", "STATE", "GPUS", "QUEUE", "ETA", "REASON", "AGE",
    ]  # fmt: skip
    assert rows[0].split()[:10] == [
        "12", "train-b", "job", "vision", "ada", "pending", "2x4", "3", "-", "QUOTA_EXCEEDED",
    ]  # fmt: skip
    assert rows[1].split() == ["11", "nb", "notebook", "vision", "bob", "running", "0", "-", "-", "-", "-"]


def test_ls_table_shows_when_waiting_work_should_start() -> None:
    soon = (datetime.now(UTC) + timedelta(hours=2, seconds=30)).isoformat()
    waiting = {**WORKLOADS[0], "estimated_start_at": soon, "estimate_basis": "After workload 7 ends."}
    running = {**WORKLOADS[1], "estimated_start_at": soon}

    rows = rendered(workloads_table([Workload.from_json(waiting), Workload.from_json(running)])).splitlines()[1:]

    assert rows[0].split()[8] == "~2h"
    assert rows[1].split()[8] == "-", "only waiting work has an ETA"


def test_until_reads_a_time_ahead_as_a_table_cell() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)

    assert until("2026-01-01T02:10:00Z", now=now) == "~2h"
    assert until("2026-01-03T00:00:00Z", now=now) == "~2d"
    assert until("2026-01-01T00:05:00Z", now=now) == "~5m"
    assert until("2025-12-31T23:00:00Z", now=now) == "now"
    assert until(None, now=now) == "-"


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_structured_output_is_the_api_objects_exactly(canned: AppState, fmt: str) -> None:
    listed = CliRunner().invoke(cli, ["-o", fmt, "ls", "--state", "pending"], obj=canned)
    described = CliRunner().invoke(cli, ["-o", fmt, "describe", "12"], obj=canned)

    load = json.loads if fmt == "json" else yaml.safe_load
    assert load(listed.stdout) == [WORKLOADS[0]]
    assert load(described.stdout) == DETAIL
    assert listed.stderr == described.stderr == ""


def test_dump_keeps_the_api_key_order_and_unicode() -> None:
    data = {"zeta": 1, "alpha": "ünï", "list": [1, None]}

    assert list(json.loads(dump(data, "json"))) == ["zeta", "alpha", "list"]
    assert dump(data, "yaml") == "zeta: 1\nalpha: ünï\nlist:\n- 1\n- null"


def test_describe_says_why_it_waits_and_how_it_launches() -> None:
    page = " ".join(rendered(describe_view(WorkloadDetail.from_json(DETAIL), "http://console.test")).split())

    assert "Reason QUOTA_EXCEEDED: The project's quota in pool a100 is in use. Hint Wait, or ask" in page
    assert "Hint Wait, or ask an admin to raise the limit. Actions cancel Queue position 3" in page
    assert "Command python train.py --note 'two words'" in page
    assert "GPUs 2x4 (any model) CPU / memory 1.5 CPU, 8192 MiB per replica" in page
    assert "Shared memory runtime default (Docker: 64 MiB)" in page
    with_shm = rendered(describe_view(WorkloadDetail.from_json({**DETAIL, "shm_mib": 2048}), "http://console.test"))
    assert "Shared memory 2048 MiB per replica" in " ".join(with_shm.split())
    assert "Launch steps ✓ Queued > Placed on a node waiting for quota · Image pulled" in page
    assert "workload.submitted → pending" in page


def test_cells_read_as_people_expect() -> None:
    now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

    assert [text(None), text(""), text([]), text(["a", "b"]), text(True), text(0)] == ["-", "-", "-", "a,b", "yes", "0"]
    assert ago("2026-01-01T11:59:30Z", now=now) == "30s"
    assert ago("2026-01-01T09:00:00+00:00", now=now) == "3h"
    assert ago("2025-12-29T12:00:00Z", now=now) == "3d"
    assert ago(None) == "-" and ago("yesterday") == "yesterday"
    assert [size(None), size(512), size(1536), size(5 * 2**30)] == ["-", "512 B", "1.5 KiB", "5.0 GiB"]


def test_quota_and_usage_tables() -> None:
    quotas = [
        Quota(pool="a100", project="vision", guaranteed=2, limit=4, max_runtime_seconds=3600),
        Quota(pool="a100", guaranteed=8, limit=None, weight=1),
    ]
    uses = [QuotaUse(project=None, pool="a100", guaranteed=8, limit=16, in_use=3, borrowed=1, running=2, pending=5)]

    quota_rows = rendered(quota_table(quotas)).splitlines()
    usage_rows = rendered(usage_table(uses)).splitlines()

    assert quota_rows[1].split() == ["(tenant)", "a100", "8", "-", "1", "-", "-", "-"]
    assert quota_rows[2].split() == ["vision", "a100", "2", "4", "-", "-", "-", "3600", "s"]
    assert usage_rows[1].split() == ["(tenant)", "a100", "3/16", "8", "16", "1", "2", "5"]


def test_log_lines_as_text_timestamps_and_json() -> None:
    line = LogLine.from_row([7, "2026-01-01T00:00:01Z", "stderr", "loss 0.1", 1, 0])
    out = io.StringIO()

    LinePrinter(out, "table").print_all([line])
    LinePrinter(out, "table", timestamps=True).print_all([line])
    LinePrinter(out, "json").print_all([line])

    plain, stamped, as_json = out.getvalue().splitlines()
    assert (plain, stamped) == ("loss 0.1", "2026-01-01T00:00:01Z loss 0.1")
    assert json.loads(as_json) == dict(
        seq=7, timestamp="2026-01-01T00:00:01Z", stream="stderr", text="loss 0.1", attempt=1, replica=0
    )


def test_submit_flags_become_only_the_fields_given() -> None:
    flags: dict[str, Any] = {"image": "img", "gpus": 0, "replicas": None, "gpu_models": ("A100", "H100")}
    flags["env_pairs"] = ("A=1", "B=x=y")

    body = flags_body("train", ("python", "-c", "print(1)"), flags)

    assert body == {
        "name": "train",
        "image": "img",
        "gpus_per_replica": 0,
        "gpu_models": ["A100", "H100"],
        "env": {"A": "1", "B": "x=y"},
        "command": ["python", "-c", "print(1)"],
    }


def test_submit_refuses_an_env_without_equals_and_logs_without_wait() -> None:
    bad_env = CliRunner().invoke(cli, ["submit", "x", "--image", "i", "-e", "NOPE"])
    logs_alone = CliRunner().invoke(cli, ["submit", "x", "--image", "i", "--logs"])

    assert bad_env.exit_code == 2 and "expected K=V, got 'NOPE'" in bad_env.stderr
    assert logs_alone.exit_code == 2 and "--logs needs --wait" in logs_alone.stderr


def test_top_rows_one_per_gpu_with_its_newest_sample() -> None:
    detail = WorkloadDetail.from_json(
        {
            "id": 5,
            "name": "big",
            "state": "running",
            "allocations": [
                {"replica": 0, "node": "n1", "gpu_index": 0, "gpu_uuid": "GPU-a", "gpu_model": "A100"},
                {"replica": 0, "node": "n1", "gpu_index": 1, "gpu_uuid": "GPU-b", "gpu_model": "A100"},
                {"replica": 0, "node": "n0", "gpu_index": 3, "gpu_uuid": "GPU-z", "released_at": "2026-01-01"},
            ],
        }
    )
    model = TopModel(owner="ada", workloads={5: detail})
    sample = {"uuid": "GPU-a", "index": 0, "utilization_gpu": 87, "memory_used_mib": 40960, "memory_total_mib": 81920}
    model.take(GpuBatch.from_json({"node": "n1", "at": 0, "gpus": [{**sample, "power_w": 301.4, "temperature_c": 64}]}))

    page = rendered(model.render("acme"))

    assert "gpc top: ada in acme: 1 running, 2 GPUs" in page
    assert "5   big   n1    0    A100   █████████░  87%  40.0 / 80.0 GiB  301 W  64 °C" in page
    assert "GPU-z" not in page and "n0" not in page
    assert "waiting" in page.splitlines()[-1]
    assert utilization_bar(None).plain == "-" and utilization_bar(5).plain == "░░░░░░░░░░   5%"
