"""Settings as a fresh process sees them: embedded defaults, strict failures, deploy checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_SERVICE_VARS = ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "GPUCLOUD_HTTPS")


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


def test_production_settings_pass_the_deploy_check(tmp_path: Path) -> None:
    result = _run(
        "import django, sys; django.setup(); from django.core.management import call_command; "
        "call_command('check', deploy=True, fail_level='WARNING')",
        tmp_path,
        DEBUG="0",
        GPUCLOUD_HTTPS="1",
        SECRET_KEY="k" * 20 + "-not-a-real-key-but-long-enough-for-the-check-0123456789",
        ALLOWED_HOSTS="gpucloud.example.com",
        REDIS_URL="redis://127.0.0.1:6379/0",
    )
    assert result.returncode == 0, result.stderr
