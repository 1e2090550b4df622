"""The agent role (GPUCLOUD_ROLE=agent): settings load with none of the console's secrets, and no database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_SECRETS = ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "GPUCLOUD_ROLE")

_AGENT = """
import django
django.setup()
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
import inventory.agent.remote.agent, inventory.agent.remote.join, inventory.agent.tasks
try:
    connection.cursor()
    print("database: reachable")
except ImproperlyConfigured:
    print("database: none")
print(settings.ROLE, settings.EMBEDDED, settings.CELERY_BROKER_URL, settings.CHANNEL_LAYERS["live"]["BACKEND"])
print(settings.SECRET_KEY)
"""


def _run(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in _SECRETS}
    environ.update(DJANGO_SETTINGS_MODULE="gpucloud.settings", GPUCLOUD_DATA_DIR=str(tmp_path / "data"), **extra)
    return subprocess.run(
        [sys.executable, "-c", _AGENT], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_agent_role_starts_without_secret_key_database_or_redis_and_keeps_no_key(tmp_path: Path) -> None:
    first = _run(tmp_path, GPUCLOUD_ROLE="agent")
    second = _run(tmp_path, GPUCLOUD_ROLE="agent")
    assert first.returncode == 0, first.stderr
    database, services, key = first.stdout.strip().splitlines()
    assert database == "database: none", "any query must fail: the agent never touches the database"
    assert services == "agent True memory://localhost/ common.live_layer.InProcessChannelLayer"
    assert len(key) >= 50 and key != second.stdout.strip().splitlines()[-1], "a random key per process"
    assert not (tmp_path / "data").exists(), "nothing persisted: no secret_key file, no SQLite database"


def test_the_agent_role_never_reads_the_consoles_secrets_even_when_they_are_set(tmp_path: Path) -> None:
    result = _run(
        tmp_path,
        GPUCLOUD_ROLE="agent",
        SECRET_KEY="console-secret-key-" + "x" * 40,
        DATABASE_URL="postgres://gpucloud:password@db.internal:5432/gpucloud",
        REDIS_URL="redis://redis.internal:6379/0",
    )
    assert result.returncode == 0, result.stderr
    database, services, key = result.stdout.strip().splitlines()
    assert database == "database: none" and services.startswith("agent True memory://")
    assert "console-secret-key" not in key


def test_an_unknown_role_stops_start_up_naming_the_variable(tmp_path: Path) -> None:
    result = _run(tmp_path, GPUCLOUD_ROLE="controller")
    assert result.returncode != 0 and "GPUCLOUD_ROLE" in result.stderr
