"""`gpc login`, `logout`, `contexts`, `use`, `whoami`: what is saved, what is refused, and that no output
ever shows a token. The console's answers are canned `me/` envelopes (MockTransport) or failures.
"""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml
from click.testing import CliRunner, Result

from gpucloud_client.cli.main import cli
from gpucloud_client.cli.state import AppState

TOKEN = "gpc_0123456789ab_abcdefghijklmnopqrstuvwxyz012345"
OTHER = "gpc_ba9876543210_zyxwvutsrqponmlkjihgfedcba543210"
ME = {
    "username": "ada",
    "email": "ada@example.com",
    "is_operator": False,
    "token": {"id": 3, "prefix": "0123456789ab", "name": "laptop", "role": "member", "tenant": "acme"},
    "memberships": [{"tenant": "acme", "tenant_name": "Acme", "role": "member"}],
}
Handler = Callable[[httpx.Request], httpx.Response]


@pytest.fixture
def config_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Where this test's contexts file lives; no context comes from the environment."""
    path = tmp_path / "gpucloud" / "config.yaml"
    monkeypatch.setenv("GPUCLOUD_CONFIG", str(path))
    for name in ("GPUCLOUD_URL", "GPUCLOUD_TOKEN", "GPUCLOUD_TENANT", "GPUCLOUD_PROJECT", "GPUCLOUD_CONTEXT"):
        monkeypatch.delenv(name, raising=False)
    return path


def me_answer(seen: list[httpx.Request]) -> Handler:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=ME)

    return handle


def run(args: list[str], handler: Handler, stdin: str | None = None) -> Result:
    state = AppState(transport=httpx.MockTransport(handler), client_options={"retries": 0, "backoff": 0})
    return CliRunner().invoke(cli, args, obj=state, input=stdin)


def login(seen: list[httpx.Request], *extra: str, token: str = TOKEN) -> Result:
    return run(["login", "http://console.test/", "--token-stdin", *extra], me_answer(seen), stdin=token + "\n")


def test_login_checks_the_token_then_saves_it_owner_only(config_path: Path) -> None:
    seen: list[httpx.Request] = []

    result = login(seen, "--project", "vision")

    assert result.exit_code == 0, result.output
    assert [(r.url.path, r.headers["Authorization"]) for r in seen] == [("/api/v1/me/", f"Bearer {TOKEN}")]
    saved = yaml.safe_load(config_path.read_text())
    assert saved == {
        "current": "acme@console.test",
        "contexts": {
            "acme@console.test": {"url": "http://console.test", "token": TOKEN, "tenant": "acme", "project": "vision"}
        },
    }
    assert stat.S_IMODE(config_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(config_path.parent.stat().st_mode) == 0o700
    assert "Logged in to http://console.test as ada in tenant acme" in result.stderr
    assert TOKEN not in result.output


def test_login_refused_by_the_console_saves_nothing(config_path: Path) -> None:
    body = {"error": {"code": "authentication_failed", "message": "Invalid or expired token.", "request_id": "r"}}

    result = run(
        ["login", "http://console.test", "--token-stdin"], lambda r: httpx.Response(401, json=body), stdin=TOKEN
    )

    assert result.exit_code == 4
    assert result.stderr == "error: Invalid or expired token.\n"
    assert not config_path.exists()


def test_login_refuses_an_empty_token_and_a_url_that_is_no_console(config_path: Path) -> None:
    seen: list[httpx.Request] = []

    empty = run(["login", "http://console.test", "--token-stdin"], me_answer(seen), stdin="\n")
    bad_url = run(["login", "console.test", "--token-stdin"], me_answer(seen), stdin=TOKEN)

    assert empty.exit_code == 2 and "no token given" in empty.stderr
    assert bad_url.exit_code == 1 and "http(s)://host" in bad_url.stderr
    assert seen == [] and not config_path.exists()


def test_login_prompts_without_echo(config_path: Path) -> None:
    seen: list[httpx.Request] = []

    result = run(["login", "http://console.test", "--name", "prod"], me_answer(seen), stdin=TOKEN + "\n")

    assert result.exit_code == 0, result.output
    assert "API token" in result.stderr
    assert TOKEN not in result.output
    assert yaml.safe_load(config_path.read_text())["current"] == "prod"


def test_contexts_use_and_logout_never_show_a_token(config_path: Path) -> None:
    seen: list[httpx.Request] = []
    login(seen, "--name", "prod")
    login(seen, "--name", "lab", "--tenant", "research", token=OTHER)

    table = run(["contexts"], me_answer(seen))
    as_json = run(["-o", "json", "contexts"], me_answer(seen))
    used = run(["use", "prod"], me_answer(seen))
    unknown = run(["use", "nope"], me_answer(seen))
    gone = run(["logout", "prod"], me_answer(seen))

    for result in (table, as_json, used, unknown, gone):
        assert TOKEN not in result.output and OTHER not in result.output
    assert table.stdout.splitlines()[0].split() == ["CURRENT", "NAME", "URL", "TENANT", "PROJECT"]
    assert [line.split()[:2] for line in table.stdout.splitlines()[1:]] == [
        ["*", "lab"],
        ["prod", "http://console.test"],
    ]
    assert [c["name"] for c in yaml.safe_load(as_json.stdout)] == ["lab", "prod"]
    assert used.exit_code == 0 and unknown.exit_code == 1 and "no context named 'nope'" in unknown.stderr
    assert gone.exit_code == 0
    assert list(yaml.safe_load(config_path.read_text())["contexts"]) == ["lab"]


def test_whoami_shows_the_redacted_prefix_only(config_path: Path) -> None:
    seen: list[httpx.Request] = []
    login(seen)

    table = run(["whoami"], me_answer(seen))
    as_yaml = run(["-o", "yaml", "whoami"], me_answer(seen))

    assert table.exit_code == 0, table.output
    assert "gpc_0123456789ab_…" in table.stdout and "ada <ada@example.com>" in table.stdout
    assert yaml.safe_load(as_yaml.stdout) == ME
    assert TOKEN not in table.output + as_yaml.output


def test_a_file_others_may_read_is_refused(config_path: Path) -> None:
    seen: list[httpx.Request] = []
    login(seen)
    config_path.chmod(0o644)

    result = run(["contexts"], me_answer(seen))

    assert result.exit_code == 1
    assert "chmod 600" in result.stderr
    assert TOKEN not in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["whoami"],
        ["ls"],
        ["describe", "1"],
        ["logs", "1"],
        ["cancel", "1"],
        ["usage"],
        ["quota"],
        ["volumes", "ls"],
        ["submit", "x", "--image", "i"],
    ],
)
@pytest.mark.parametrize("status", [400, 401, 500])
def test_no_failure_ever_prints_the_token(config_path: Path, args: list[str], status: int) -> None:
    """Even a console that echoes the token back in its error message gets it scrubbed."""
    seen: list[httpx.Request] = []
    login(seen)
    body = {
        "error": {"code": "x", "message": f"bad token {TOKEN}", "fields": {"token": [{"code": "x", "message": TOKEN}]}}
    }

    result = run(args, lambda r: httpx.Response(status, json=body))

    assert result.exit_code != 0
    assert TOKEN not in result.output
    assert "gpc_0123456789ab_…" in result.stderr
