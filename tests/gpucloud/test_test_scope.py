"""The rule that decides which tests CI's Postgres and Redis pass runs (tests/conftest.py, GPUCLOUD_TESTS)."""

from __future__ import annotations

import contextvars
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT, embedded_too, runs_embedded_too, touches_backends


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
    said = refused.stdout + refused.stderr
    assert "GPUCLOUD_TESTS='some': it must be one of all, backend-dependent, embedded" in said


def _collected(scope: str, *paths: str) -> set[str]:
    env = {**os.environ, "GPUCLOUD_TESTS": scope}
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", *paths]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return {line.split("::", 1)[0] for line in done.stdout.splitlines() if "::" in line}


def test_the_embedded_scope_keeps_pure_tests_and_listed_database_tests_and_drops_the_rest() -> None:
    files: tuple[str, ...] = ("tests/jobs/test_fast_sql.py", "tests/api/test_list_query_counts.py")
    files += ("tests/jobs/scheduler/test_core_tables.py",)
    assert _collected("embedded", *files) == {"tests/jobs/test_fast_sql.py", "tests/jobs/scheduler/test_core_tables.py"}
    dependent = {"tests/jobs/test_fast_sql.py", "tests/api/test_list_query_counts.py"}
    assert _collected("backend-dependent", *files) == dependent


def test_an_entry_names_a_file_or_a_directory_and_nothing_else() -> None:
    paths = {"tests/a/", "tests/b/test_c.py"}
    assert runs_embedded_too("tests/a/test_x.py::test_y", paths)
    assert runs_embedded_too("tests/b/test_c.py::test_y[1]", paths)
    assert not runs_embedded_too("tests/b/test_c_more.py::test_y", paths)
    assert not runs_embedded_too("tests/ab/test_x.py::test_y", paths)


def test_every_listed_path_exists() -> None:
    missing = [path for path in embedded_too() if not (ROOT / path).exists()]
    assert not missing, f"tests/embedded_too.toml names paths that do not exist: {missing}"


# A database test file that starts processes or runs work concurrently can fail on SQLite alone.
PROCESSES_OR_CONCURRENCY = re.compile(
    r"live_server|Popen|ThreadPoolExecutor|threading\.Thread|concurrent\.futures|asyncio\.gather|tests\.workers"
)
USES_DATABASE = re.compile(r"django_db|live_server|transactional_db")


def test_every_database_test_file_with_processes_or_concurrency_runs_embedded_too() -> None:
    listed = embedded_too()
    missing = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        source = path.read_text()
        name = path.relative_to(ROOT).as_posix()
        risky = USES_DATABASE.search(source) and PROCESSES_OR_CONCURRENCY.search(source)
        if risky and not runs_embedded_too(name + "::", listed):
            missing.append(name)
    assert not missing, f"add these to tests/embedded_too.toml (rule: processes or concurrency): {missing}"


# --- each test's cache namespace (tests/cache_keys.py) --------------------------------------------------

CONTEXT_SIZES: list[int] = []


@pytest.mark.parametrize("round_", range(3))
def test_each_test_has_a_cache_namespace_of_its_own_and_leaves_no_context_variable_behind(round_: int) -> None:
    from django.conf import settings
    from django.core.cache import cache

    prefix = settings.CACHES["default"]["KEY_PREFIX"]
    assert prefix.startswith("test-")
    assert cache.make_key("k") == f"{prefix}:1:k", "the key is made with this test's prefix"
    assert cache.get("written-by-an-earlier-round") is None, "nothing cached by an earlier test is seen"
    cache.set("written-by-an-earlier-round", round_)
    CONTEXT_SIZES.append(len(contextvars.copy_context()))
    # The first use of the cache may set its handler's variable, once; after that no test adds one.
    assert len(set(CONTEXT_SIZES[1:])) <= 1, f"the main thread's context grew from test to test: {CONTEXT_SIZES}"
