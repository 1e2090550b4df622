"""The remote agent's credential file and console URL: private by construction, refused when not."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from inventory.agent.remote.client import ConsoleUrlRefused, check_console_url
from inventory.agent.remote.credential import (
    SYSTEM_PATH,
    Credential,
    CredentialFileError,
    default_credential_path,
    load_credential,
    save_credential,
)

CREDENTIAL = Credential(console="https://console.example.com", node="gpu-7", credential="s3cret", ca_file="/etc/ca.pem")


@pytest.fixture
def open_umask() -> Iterator[None]:
    """Run with umask 0: permissions must come from the code, not from a careful shell."""
    previous = os.umask(0)
    yield
    os.umask(previous)


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_the_default_path_is_the_system_one_for_root_and_the_users_config_otherwise(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert default_credential_path() == SYSTEM_PATH == Path("/var/lib/gpucloud/agent/credential.json")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert default_credential_path() == tmp_path / ".config/gpucloud/agent.json"


def test_a_saved_credential_is_owner_only_in_owner_only_directories(tmp_path: Path, open_umask: None) -> None:
    path = tmp_path / "state" / "gpucloud" / "agent.json"
    save_credential(path, CREDENTIAL)
    assert _mode(path) == 0o600
    assert _mode(path.parent) == 0o700 and _mode(path.parent.parent) == 0o700
    assert json.loads(path.read_text()) == {
        "console": "https://console.example.com",
        "node": "gpu-7",
        "credential": "s3cret",
        "ca_file": "/etc/ca.pem",
    }
    assert load_credential(path) == CREDENTIAL


def test_an_existing_credential_is_replaced_only_when_forced(tmp_path: Path, open_umask: None) -> None:
    path = tmp_path / "agent.json"
    save_credential(path, CREDENTIAL)
    newer = Credential(console="https://c.example.com", node="gpu-8", credential="other", heartbeat_seconds=2.0)
    with pytest.raises(CredentialFileError, match="already exists: pass --force"):
        save_credential(path, newer)
    assert load_credential(path) == CREDENTIAL
    save_credential(path, newer, force=True)
    assert load_credential(path) == newer and _mode(path) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.json"], "nothing left aside"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660])
def test_a_credential_others_can_read_is_refused_with_the_fix(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "agent.json"
    save_credential(path, CREDENTIAL)
    path.chmod(mode)
    with pytest.raises(CredentialFileError, match=f"chmod 600 {path}"):
        load_credential(path)
    path.chmod(0o600)
    assert load_credential(path) == CREDENTIAL


def test_a_missing_or_broken_credential_says_to_join(tmp_path: Path) -> None:
    with pytest.raises(CredentialFileError, match="gpucloud agent join"):
        load_credential(tmp_path / "absent.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"console": "https://c"}')
    broken.chmod(0o600)
    with pytest.raises(CredentialFileError, match="not an agent credential file"):
        load_credential(broken)


def test_a_symlinked_credential_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    save_credential(real, CREDENTIAL)
    (tmp_path / "link.json").symlink_to(real)
    with pytest.raises(CredentialFileError, match="cannot open"):
        load_credential(tmp_path / "link.json")


@pytest.mark.parametrize(
    "url",
    [
        "https://console.example.com/",
        "https://10.0.0.5:8443",
        "http://127.0.0.1:8000",
        "http://127.9.8.7",
        "http://localhost:8000/",
        "http://[::1]:8000",
    ],
)
def test_https_or_loopback_http_consoles_are_accepted(url: str) -> None:
    assert check_console_url(url) == url.rstrip("/")


@pytest.mark.parametrize(
    "url",
    ["http://console.example.com", "http://10.0.0.5:8000", "http://localhost.example.com", "http://[::2]:80"],
)
def test_plain_http_beyond_loopback_is_refused_unless_explicitly_allowed(url: str) -> None:
    with pytest.raises(ConsoleUrlRefused, match="--allow-http"):
        check_console_url(url)
    assert check_console_url(url, allow_http=True) == url


@pytest.mark.parametrize("url", ["ftp://console.example.com", "console.example.com", "https://"])
def test_what_is_not_an_http_url_is_refused(url: str) -> None:
    with pytest.raises(ConsoleUrlRefused, match="not a console URL"):
        check_console_url(url, allow_http=True)
