"""How `gpc` reports failures: `error:` lines naming every field and rule, and the documented exit codes.

The console is never stood in for here: httpx.MockTransport only injects failures (error envelopes,
dropped connections), and each test checks what the CLI makes of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner, Result

from gpucloud_client.cli.main import cli
from gpucloud_client.cli.output import error_lines
from gpucloud_client.cli.state import AppState
from gpucloud_client.cli.waiting import combined_exit_code
from gpucloud_client.errors import ApiError, ClientError, FieldError, SpecError, SpecIssue
from gpucloud_client.models import WorkloadDetail

TOKEN = "gpc_0123456789ab_abcdefghijklmnopqrstuvwxyz012345"
Handler = Callable[[httpx.Request], httpx.Response]


def envelope(status: int, code: str, message: str, fields: dict[str, list[dict[str, str]]] | None = None) -> Handler:
    """Return a handler answering every request with the API's error envelope."""
    body = {
        "error": {"code": code, "message": message, "request_id": "req-42", **({"fields": fields} if fields else {})}
    }
    return lambda request: httpx.Response(status, json=body)


@pytest.fixture(autouse=True)
def _environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A context from the environment alone, and a contexts file nobody else's tests can see."""
    monkeypatch.setenv("GPUCLOUD_CONFIG", str(tmp_path / "gpucloud" / "config.yaml"))
    monkeypatch.setenv("GPUCLOUD_URL", "http://console.test")
    monkeypatch.setenv("GPUCLOUD_TOKEN", TOKEN)
    monkeypatch.setenv("GPUCLOUD_TENANT", "acme")
    monkeypatch.setenv("GPUCLOUD_PROJECT", "vision")
    monkeypatch.delenv("GPUCLOUD_CONTEXT", raising=False)


def run(args: list[str], handler: Handler, seen: list[httpx.Request] | None = None, stdin: str | None = None) -> Result:
    """Run `gpc args` with every request answered by `handler` (recorded in `seen`), retries off."""

    def recording(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        return handler(request)

    state = AppState(transport=httpx.MockTransport(recording), client_options={"retries": 0, "backoff": 0})
    return CliRunner().invoke(cli, args, obj=state, input=stdin)


def test_an_api_error_names_every_field_with_its_rule() -> None:
    error = ApiError(
        400,
        "validation_error",
        "name: Use lowercase letters.",
        fields={
            "name": [FieldError("invalid_name", "Use lowercase letters.")],
            "gpus_per_replica": [FieldError("out_of_range", "0 to 64.")],
            "env.LD_PRELOAD": [FieldError("forbidden_env", "Injects code."), FieldError("invalid_env_value", "x")],
        },
        request_id="req-1",
    )

    assert error_lines(error) == [
        "error: name: Use lowercase letters.",
        "  name: invalid_name: Use lowercase letters.",
        "  gpus_per_replica: out_of_range: 0 to 64.",
        "  env.LD_PRELOAD: forbidden_env: Injects code.",
        "  env.LD_PRELOAD: invalid_env_value: x",
    ]


def test_a_server_error_shows_its_request_id_and_a_client_error_only_its_message() -> None:
    assert error_lines(ApiError(500, "server_error", "Server error.", request_id="abc")) == [
        "error: Server error.",
        "  (request id abc: quote it to the console's operators)",
    ]
    assert error_lines(ClientError("not logged in")) == ["error: not logged in"]


def test_spec_issues_are_placed_at_file_line_and_document() -> None:
    issues = [
        SpecIssue("sweep.yaml", 2, 7, "gpus_per_replica", "out_of_range", "0 to 64."),
        SpecIssue("sweep.yaml", 3, 12, "", "invalid_yaml", "mapping values are not allowed here", column=9),
    ]

    assert error_lines(SpecError(issues)) == [
        "error: the spec has 2 problems",
        "  sweep.yaml:7 (document 2) gpus_per_replica: out_of_range: 0 to 64.",
        "  sweep.yaml:12:9 (document 3) invalid_yaml: mapping values are not allowed here",
    ]


def test_error_lines_scrub_a_token_even_from_a_message() -> None:
    lines = error_lines(ClientError(f"refused {TOKEN}"), secrets=[TOKEN])

    assert lines == ["error: refused gpc_0123456789ab_…"]


@pytest.mark.parametrize(
    ("status", "code", "exit_code"),
    [
        (400, "validation_error", 3),
        (401, "not_authenticated", 4),
        (403, "permission_denied", 4),
        (404, "not_found", 5),
        (409, "illegal_transition", 6),
        (429, "throttled", 7),
        (500, "server_error", 7),
        (503, "unavailable", 7),
    ],
)
def test_each_status_exits_with_its_documented_code(status: int, code: str, exit_code: int) -> None:
    result = run(["cancel", "12"], envelope(status, code, f"refused: {code}"))

    assert result.exit_code == exit_code
    assert f"error: refused: {code}" in result.stderr
    assert result.stdout == ""


def test_a_connection_that_keeps_failing_exits_unavailable() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    result = run(["ls"], refuse)

    assert result.exit_code == 7
    assert result.stderr.startswith("error: ")
    assert TOKEN not in result.output


def test_no_login_at_all_exits_auth(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUCLOUD_URL")
    monkeypatch.delenv("GPUCLOUD_TOKEN")

    result = run(["ls"], envelope(500, "unused", "unused"))

    assert result.exit_code == 4
    assert "not logged in" in result.stderr


def test_ctrl_c_exits_130() -> None:
    def interrupt(request: httpx.Request) -> httpx.Response:
        raise KeyboardInterrupt

    result = run(["describe", "3"], interrupt)

    assert result.exit_code == 130
    assert "interrupted" in result.stderr


def test_a_bad_command_line_exits_2_without_a_request() -> None:
    seen: list[httpx.Request] = []

    result = run(["logs", "not-a-number"], envelope(500, "unused", "unused"), seen)

    assert result.exit_code == 2
    assert seen == []


def test_an_action_on_several_workloads_tries_each_and_reports_every_failure() -> None:
    seen: list[httpx.Request] = []

    result = run(["cancel", "1", "2"], envelope(409, "illegal_transition", "It has already ended."), seen)

    assert [r.url.path for r in seen] == [
        "/api/v1/tenants/acme/workloads/1/cancel/",
        "/api/v1/tenants/acme/workloads/2/cancel/",
    ]
    assert result.stderr.count("error: It has already ended.") == 2
    assert result.exit_code == 6


SPEC = """\
name: one
image: img
---
name: two
image: img
gpus_per_replica: 99
---
name: three
imagee: img
"""


def test_a_spec_with_local_problems_reports_them_even_when_the_api_cannot_be_asked(tmp_path: Path) -> None:
    spec = tmp_path / "sweep.yaml"
    spec.write_text(SPEC)
    seen: list[httpx.Request] = []

    result = run(["submit", "-f", str(spec)], envelope(503, "unavailable", "down"), seen)

    assert result.exit_code == 3
    assert [r.url.path for r in seen] == ["/api/v1/tenants/acme/workloads/bulk/validate/"]
    assert result.stderr.splitlines() == [
        "error: the spec has 1 problem",
        f"  {spec}:9 (document 3) imagee: unknown_field: Unknown field; did you mean 'image'? "
        + "allowed: command, cpu_milli, env, gpu_models, gpus_per_replica, image, kind, max_runtime_seconds, "
        + "memory_mib, name, pool, preset, priority_class, project, replicas, requeue_limit, shm_mib, stop_signal, "
        + "tenant.",
    ]


def test_local_and_api_problems_come_together_and_unknown_keys_are_not_sent(tmp_path: Path) -> None:
    spec = tmp_path / "sweep.yaml"
    spec.write_text(SPEC)
    seen: list[httpx.Request] = []
    fields = {"items[1].gpus_per_replica": [{"code": "out_of_range", "message": "At most 64."}]}

    result = run(["submit", "-f", str(spec)], envelope(400, "validation_error", "bad", fields), seen)

    assert result.exit_code == 3
    assert len(seen) == 1 and "imagee" not in seen[0].content.decode()
    lines = result.stderr.splitlines()
    assert lines[0] == "error: the spec has 2 problems"
    assert lines[1] == f"  {spec}:6 (document 2) gpus_per_replica: out_of_range: At most 64."
    assert lines[2].startswith(f"  {spec}:9 (document 3) imagee: unknown_field:")


def test_a_spec_that_is_not_yaml_sends_nothing(tmp_path: Path) -> None:
    spec = tmp_path / "broken.yaml"
    spec.write_text("name: [unclosed\n")
    seen: list[httpx.Request] = []

    result = run(["submit", "-f", str(spec)], envelope(500, "unused", "unused"), seen)

    assert result.exit_code == 3
    assert seen == []
    assert f"  {spec}:2:1 (document 1) invalid_yaml:" in result.stderr


def test_a_missing_spec_file_is_a_usage_error(tmp_path: Path) -> None:
    result = run(["submit", "-f", str(tmp_path / "nope.yaml")], envelope(500, "unused", "unused"))

    assert result.exit_code == 2
    assert "cannot read" in result.stderr


def test_api_validation_errors_land_on_their_documents_lines_and_nothing_is_submitted(tmp_path: Path) -> None:
    spec = tmp_path / "sweep.yaml"
    spec.write_text(SPEC.replace("imagee", "image"))
    seen: list[httpx.Request] = []
    fields = {
        "items[1].gpus_per_replica": [{"code": "out_of_range", "message": "Ensure this value is at most 64."}],
        "items[2].image": [{"code": "image_not_allowed", "message": "No allowed image matches."}],
    }

    result = run(["submit", "-f", str(spec)], envelope(400, "validation_error", "bad", fields), seen)

    assert result.exit_code == 3
    assert [r.url.path for r in seen] == ["/api/v1/tenants/acme/workloads/bulk/validate/"]
    assert json.loads(seen[0].content)["project"] == "vision"
    assert result.stderr.splitlines()[1:] == [
        f"  {spec}:6 (document 2) gpus_per_replica: out_of_range: Ensure this value is at most 64.",
        f"  {spec}:9 (document 3) image: image_not_allowed: No allowed image matches.",
    ]


def test_flags_that_the_api_refuses_report_every_field() -> None:
    fields = {
        "name": [{"code": "invalid_name", "message": "Lowercase letters, digits or hyphens."}],
        "gpus_per_replica": [{"code": "out_of_range", "message": "0 to 64."}],
    }

    result = run(
        ["submit", "Bad_Name", "--image", "img", "--gpus", "99"], envelope(400, "validation_error", "x", fields)
    )

    assert result.exit_code == 3
    assert "  name: invalid_name: Lowercase letters, digits or hyphens." in result.stderr
    assert "  gpus_per_replica: out_of_range: 0 to 64." in result.stderr


@pytest.mark.parametrize(
    ("finals", "expected"),
    [
        ([("succeeded", None)], 0),
        ([("succeeded", 0), ("failed", 3)], 3),
        ([("failed", None)], 1),
        ([("cancelled", None), ("failed", 2)], 8),
        ([("lost", None)], 9),
        ([("hibernated", None)], 0),
        ([("failed", -9)], 1),
    ],
)
def test_wait_exits_with_the_first_workload_that_did_not_succeed(
    finals: list[tuple[str, int | None]], expected: int
) -> None:
    details = [WorkloadDetail(id=n, state=state, exit_code=code) for n, (state, code) in enumerate(finals)]

    assert combined_exit_code(details) == expected
