"""The rule that decides which tests CI's Postgres and Redis pass runs (tests/conftest.py, GPUCLOUD_TESTS)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, touches_backends


@pytest.mark.django_db
def test_a_test_on_the_database_depends_on_the_backends(request: pytest.FixtureRequest) -> None:
    assert touches_backends(request.node)


def test_a_test_that_asks_for_a_live_server_depends_on_the_backends(
    live_server: object, request: pytest.FixtureRequest
) -> None:
    assert touches_backends(request.node)


@pytest.mark.redis
def test_a_test_marked_for_redis_depends_on_the_backends(request: pytest.FixtureRequest) -> None:
    assert touches_backends(request.node)


def test_a_pure_test_does_not(request: pytest.FixtureRequest) -> None:
    assert not touches_backends(request.node)


def _collect(scope: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUCLOUD_TESTS": scope}
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "tests/jobs/scheduler/test_shell.py"]
    argv += ["tests/jobs/scheduler/test_fabric_placement.py"]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_the_backend_dependent_scope_keeps_the_database_tests_and_drops_the_rest() -> None:
    everything, dependent = _collect("all"), _collect("backend-dependent")
    assert everything.returncode == 0 and dependent.returncode == 0, everything.stdout + dependent.stdout
    kept = {line for line in dependent.stdout.splitlines() if "::" in line}
    assert kept and all(line.startswith("tests/jobs/scheduler/test_shell.py::") for line in kept)
    assert kept < {line for line in everything.stdout.splitlines() if "::" in line}


def test_an_unknown_scope_is_refused() -> None:
    refused = _collect("some")
    assert refused.returncode != 0
    assert "GPUCLOUD_TESTS='some': it must be one of all, backend-dependent" in refused.stdout + refused.stderr
