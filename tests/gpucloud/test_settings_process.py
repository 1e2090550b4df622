"""Settings as a fresh process sees them: embedded defaults, strict failures, deploy checks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_SERVICE_VARS = (
    *("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "GPUCLOUD_HTTPS", "ALLOWED_HOSTS", "NOTEBOOK_ORIGIN"),
)


def _run(code: str, tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in _SERVICE_VARS}
    environ.update(DJANGO_SETTINGS_MODULE="gpucloud.settings", GPUCLOUD_DATA_DIR=str(tmp_path), **extra)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120, check=False
    )


def test_embedded_defaults_keep_a_generated_secret_key(tmp_path: Path) -> None:
    code = "from django.conf import settings as s; print(s.EMBEDDED, s.DATABASES['default']['ENGINE'], s.SECRET_KEY)"
    first = _run(code, tmp_path)
    second = _run(code, tmp_path)
    assert first.returncode == 0, first.stderr
    embedded, engine, key = first.stdout.split()
    assert embedded == "True" and engine.endswith("sqlite3") and len(key) >= 50
    assert second.stdout == first.stdout, "the embedded secret key must survive restarts"
    assert (tmp_path / "secret_key").stat().st_mode & 0o077 == 0, "the key file must be private"


def test_distributed_mode_requires_a_secret_key(tmp_path: Path) -> None:
    result = _run(
        "from django.conf import settings; settings.SECRET_KEY", tmp_path, REDIS_URL="redis://127.0.0.1:6379/0"
    )
    assert result.returncode != 0
    assert "SECRET_KEY" in result.stderr


def test_malformed_variable_stops_start_up_naming_it(tmp_path: Path) -> None:
    result = _run("from django.conf import settings; settings.DEBUG", tmp_path, LOGIN_MAX_FAILURES="lots")
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "LOGIN_MAX_FAILURES" in result.stderr


def test_fast_paths_are_on_unless_named_off(tmp_path: Path) -> None:
    code = "from django.conf import settings; print(sorted(k for k, on in settings.FAST_PATHS.items() if on))"
    every = "['bulk_instances', 'jobs_sql', 'proxy_client', 'submission_ingest', 'telemetry_sql', 'token_sql']"
    assert _run(code, tmp_path).stdout.strip() == every
    off = _run(code, tmp_path, GPUCLOUD_FAST_PATHS_OFF="submission_ingest, token_sql, jobs_sql")
    assert off.stdout.strip() == "['bulk_instances', 'proxy_client', 'telemetry_sql']", off.stderr
    assert _run(code, tmp_path, GPUCLOUD_FAST_PATHS_OFF="all").stdout.strip() == "[]"


def test_an_unknown_fast_path_stops_start_up_naming_it(tmp_path: Path) -> None:
    result = _run("from django.conf import settings; settings.DEBUG", tmp_path, GPUCLOUD_FAST_PATHS_OFF="ingest")
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "GPUCLOUD_FAST_PATHS_OFF" in result.stderr
    assert "unknown fast path ingest" in result.stderr


_DEPLOY_CHECK = (
    "import django, sys; django.setup(); from django.core.management import call_command; "
    "call_command('check', deploy=True, fail_level='WARNING')"
)
_KEY = "k" * 20 + "-not-a-real-key-but-long-enough-for-the-check-0123456789"


@pytest.mark.parametrize("services", [{}, {"REDIS_URL": "redis://127.0.0.1:6379/0"}], ids=["embedded", "distributed"])
def test_debug_off_with_a_secret_key_allowed_hosts_and_a_notebook_origin_passes_the_deploy_check(
    tmp_path: Path, services: dict[str, str]
) -> None:
    result = _run(
        _DEPLOY_CHECK,
        tmp_path,
        DEBUG="0",
        SECRET_KEY=_KEY,
        ALLOWED_HOSTS="gpucloud.example.com",
        NOTEBOOK_ORIGIN="https://nb-{id}.apps.example.net",
        **services,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("origin", "problem"),
    [(None, "NOTEBOOK_ORIGIN is not set"), ("https://gpucloud.example.com", "one of the console's ALLOWED_HOSTS")],
)
def test_the_deploy_check_fails_without_a_notebook_origin_of_their_own(
    tmp_path: Path, origin: str | None, problem: str
) -> None:
    given = {"NOTEBOOK_ORIGIN": origin} if origin else {}
    result = _run(_DEPLOY_CHECK, tmp_path, DEBUG="0", SECRET_KEY=_KEY, ALLOWED_HOSTS="gpucloud.example.com", **given)
    assert result.returncode != 0 and "jobs.E001" in result.stderr and problem in result.stderr, result.stderr


def test_a_malformed_notebook_origin_stops_start_up_naming_it(tmp_path: Path) -> None:
    result = _run("from django.conf import settings; settings.DEBUG", tmp_path, NOTEBOOK_ORIGIN="https://a/path")
    assert result.returncode != 0 and "NOTEBOOK_ORIGIN" in result.stderr


def test_embedded_notebooks_default_to_the_next_loopback_port(tmp_path: Path) -> None:
    result = _run("from django.conf import settings as s; print(s.NOTEBOOK_ORIGIN)", tmp_path)
    assert result.stdout.strip() == "http://127.0.0.1:8001", result.stderr


def test_a_plain_http_opt_out_is_what_the_deploy_check_warns_about(tmp_path: Path) -> None:
    result = _run(
        _DEPLOY_CHECK,
        tmp_path,
        DEBUG="0",
        SECRET_KEY=_KEY,
        ALLOWED_HOSTS="gpucloud.example.com",
        GPUCLOUD_HTTPS="0",
        NOTEBOOK_ORIGIN="http://apps.example.net",
    )
    assert result.returncode != 0
    assert {"security.W004", "security.W008", "security.W012", "security.W016"} <= set(
        re.findall(r"security\.W\d+", result.stderr)
    )


_HARDENING = (
    "from django.conf import settings as s; "
    "print(s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE)"
)


@pytest.mark.parametrize(
    ("environ", "hardened"),
    [
        ({"DEBUG": "0", "ALLOWED_HOSTS": "gpucloud.example.com"}, True),
        ({"DEBUG": "0", "ALLOWED_HOSTS": "gpucloud.example.com,localhost"}, True),
        ({"DEBUG": "0", "ALLOWED_HOSTS": "*"}, True),
        ({"DEBUG": "0", "ALLOWED_HOSTS": "gpucloud.example.com", "GPUCLOUD_HTTPS": "0"}, False),
        ({"DEBUG": "1", "ALLOWED_HOSTS": "gpucloud.example.com"}, False),
        # `make run` / `gpucloud up`: DEBUG unset (off), the default ALLOWED_HOSTS of loopback names.
        ({}, False),
        ({"DEBUG": "0", "ALLOWED_HOSTS": "127.0.0.1,localhost,[::1],app.localhost,127.0.0.2"}, False),
        ({"DEBUG": "1", "ALLOWED_HOSTS": "localhost", "GPUCLOUD_HTTPS": "1"}, True),
    ],
)
def test_https_hardening_is_the_default_with_debug_off_and_plain_http_an_explicit_choice(
    tmp_path: Path, environ: dict[str, str], hardened: bool
) -> None:
    result = _run(_HARDENING, tmp_path, **environ)
    assert result.returncode == 0, result.stderr
    redirect, hsts, session_secure, csrf_secure = result.stdout.split()
    expected = str(hardened)
    assert (redirect, session_secure, csrf_secure) == (expected, expected, expected)
    assert (int(hsts) > 0) == hardened
