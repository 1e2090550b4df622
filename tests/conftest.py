"""Shared fixtures: persona accounts and real-service gates.

Personas: `operator` (platform staff); tenant A's `admin_a`, `member_a`,
`viewer_a`; tenant B's `admin_b` (the outsider). Tenant A has a project
`alpha`, pool `shared` has a quota for tenant A.

Tests marked `postgres`, `redis`, `browser`, `docker`, `traces` or `sshfs` skip
when the service is missing, unless GPUCLOUD_REQUIRE_SERVICES names it: then
they fail, which is how CI proves they ran against the real thing. `sshfs`
(sshfs, sshd and FUSE, to serve a real shared filesystem on 127.0.0.1) is
required wherever `docker` is: its tests need both, and CI installs both. Docker tests
run the image `test_image` names, built from busybox-static by
.ci/build-test-image when it is missing; nothing is ever pulled from outside.
`registry` (Debian's docker-registry, serving a private registry on
127.0.0.1: tests/jobs/registry.py) is likewise required wherever `docker` is:
the tests of image pulls push to it and pull from it.

`multihost` (two Docker engines in network namespaces of this machine, in
one swarm: .ci/multihost-engines; needs root, iproute2, dockerd and
debootstrap) is opt-in: its tests take minutes, so they run only where
GPUCLOUD_REQUIRE_SERVICES names it (CI's Postgres and Redis pass), fail
there when the hosts cannot be built, and skip everywhere else, saying so.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tomllib
import uuid
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from rest_framework.test import APIClient

from inventory.models import NodePool
from tenants.context import Actor
from tenants.models import Membership, Project, Tenant, TenantQuota
from tenants.scoping import deactivate_tenant
from tests.jobs.registry import registry_missing
from tests.process_user import reachable_dir

PASSWORD = "correct-horse-battery-staple"
REQUIRED = {s.strip() for s in os.environ.get("GPUCLOUD_REQUIRE_SERVICES", "").split(",") if s.strip()}
SERVICES = ("postgres", "redis", "browser", "docker", "traces", "sshfs", "registry", "tmux", "multihost")
# Services required wherever another is required: their tests need both, and CI installs both.
REQUIRED_WITH = {"registry": "docker"}
SSHFS_TOOLS = ("sshfs", "sshd", "ssh-keygen", "fusermount3")
TEST_IMAGE = "gpucloud-test/busybox:latest"
ROOT = Path(__file__).resolve().parents[1]
REDIS_DATABASES = 15  # Redis's default 16 `databases`, less the fault suite's last one (tests/faults)
# The shared cluster traces (never copied into the repository): beside the checkout, or where GPUCLOUD_TRACES_DIR says.
TRACES = Path(os.environ.get("GPUCLOUD_TRACES_DIR") or ROOT.parent / "shared" / "data" / "traces")


def chromium_path() -> str | None:
    """Return the Chromium executable tests drive, or None when there is none."""
    configured = os.environ.get("CHROMIUM_PATH")
    if configured:
        return configured if os.path.exists(configured) else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


def docker_cli() -> str:
    """Return the path of the docker client; tests that call it are marked `docker`, which checked it is there."""
    cli = shutil.which("docker")
    assert cli is not None, "the docker client is installed"
    return cli


@functools.cache
def docker_missing() -> str | None:
    """Return why no Docker engine answers here (no CLI, or `docker info` fails), or None when one does."""
    cli = shutil.which("docker")
    if cli is None:
        return "no docker CLI"
    try:
        result = subprocess.run([cli, "info"], capture_output=True, text=True, timeout=20, check=False)
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer within 20 s"
    if result.returncode != 0:
        last = result.stderr.strip().splitlines()[-1:] or ["no output"]
        return f"`docker info` failed: {last[0]}"
    return None


def _missing(service: str) -> str | None:
    if service == "postgres" and connection.vendor != "postgresql":
        return "DATABASE_URL does not point at Postgres"
    if service == "redis" and settings.REDIS_URL is None:
        return "REDIS_URL is not set"
    if service == "browser" and chromium_path() is None:
        return "no Chromium found (set CHROMIUM_PATH)"
    if service == "docker":
        return docker_missing()
    if service == "traces" and not (TRACES / "philly-derived").is_dir():
        return f"no cluster traces at {TRACES} (set GPUCLOUD_TRACES_DIR)"
    if service == "sshfs":
        return sshfs_missing()
    if service == "registry":
        return registry_missing()
    if service == "tmux" and shutil.which("tmux") is None:
        return "no tmux (Debian: tmux)"
    if service == "multihost":
        return multihost_missing()
    return None


def multihost_missing() -> str | None:
    """Return why the multi-host engines are not built here (not opted into, or cannot be), or None when they are."""
    if "multihost" not in REQUIRED:
        return "opt-in (it takes minutes): GPUCLOUD_REQUIRE_SERVICES=multihost runs it, as CI's Postgres pass does"
    if os.geteuid() != 0:
        return "network namespaces and extra Docker engines need root"
    absent = [tool for tool in ("ip", "dockerd", "docker", "debootstrap") if shutil.which(tool) is None]
    if absent:
        return f"missing {', '.join(absent)} (Debian: iproute2 docker.io debootstrap)"
    return docker_missing()


def sshfs_missing() -> str | None:
    """Return why no sshfs share can be served and mounted here, or None when it can."""
    path = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"
    absent = [tool for tool in SSHFS_TOOLS if shutil.which(tool, path=path) is None]
    if absent:
        return f"missing {', '.join(absent)} (Debian: sshfs openssh-server fuse3)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if os.geteuid() != 0:
        return "sshfs tests mount with allow_other and give volumes to other uids: they run as root"
    return None


@pytest.fixture
def as_root() -> None:
    """Fail (never skip) a test that gives files to other uids, as volumes do, when the suite is not run as root."""
    if os.geteuid() != 0:
        pytest.fail("this test gives volumes to other uids, which needs root: run the suite as root", pytrace=False)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config: pytest.Config, specs: list[Any]) -> None:
    """Give each pytest-xdist worker a Redis database of its own (1, 2, ...; db 0 stays the serial run's).

    Settings read REDIS_URL when Django starts, before any conftest runs, so the worker's environment is where
    it must change. Per-test cache prefixes (`_cache_namespace`) do not cover the rest: Celery queues and
    channel groups are named after rows, and every worker's database numbers its rows from 1. Databases are
    suffixed per worker by pytest-django; Docker names by installation (tests/inventory/drivers/conftest.py).
    """
    url = os.environ.get("REDIS_URL")
    if not url:
        return
    if len(specs) >= REDIS_DATABASES:
        raise pytest.UsageError(f"at most {REDIS_DATABASES - 1} workers share one Redis: -n {len(specs)}")
    parts = urlsplit(url)
    for index, spec in enumerate(specs, start=1):
        # A socket's path is the socket: its database is the `db` parameter.
        numbered = parts._replace(query=f"db={index}") if parts.scheme == "unix" else parts._replace(path=f"/{index}")
        spec.env["REDIS_URL"] = urlunsplit(numbered)


def pytest_configure(config: pytest.Config) -> None:
    for cache in settings.CACHES.values():  # before any cache object is made: tests/cache_keys.py says why
        cache["KEY_FUNCTION"] = "tests.cache_keys.key"
    config.addinivalue_line("markers", "sshfs: serves a real shared filesystem over sshd and mounts it with sshfs")
    config.addinivalue_line("markers", "registry: serves a private image registry on 127.0.0.1 (docker-registry)")
    config.addinivalue_line("markers", "multihost: builds two Docker engines in one swarm (.ci/multihost-engines)")


# GPUCLOUD_TESTS picks which tests run (CI runs the suite twice, once per pair of backends: README.md, "CI"):
# - `all` (the default): every test;
# - `backend-dependent`: only the tests whose outcome the database or the transport can change: those that use
#   the database (pytest-django's marker or fixtures, a live server) or are marked for Postgres, Redis or the
#   multi-host engines. CI's Postgres and Redis pass runs these;
# - `embedded`: the rest, plus the database tests whose outcome the embedded default (SQLite, the in-process
#   transport) can change, listed in tests/embedded_too.toml with the rule that puts each there. CI's embedded
#   pass runs these, so a test that uses the database runs twice only where the second run can fail.
TEST_SCOPES = ("all", "backend-dependent", "embedded")
BACKEND_MARKERS = ("django_db", "postgres", "redis", "multihost")
BACKEND_FIXTURES = frozenset({"db", "transactional_db", "django_db_reset_sequences", "live_server"})
EMBEDDED_TOO_FILE = Path(__file__).resolve().parent / "embedded_too.toml"


def touches_backends(item: pytest.Item) -> bool:
    """Return whether the test's outcome can depend on the database or the transport it runs on."""
    if any(item.get_closest_marker(marker) is not None for marker in BACKEND_MARKERS):
        return True
    return not BACKEND_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


def embedded_too() -> dict[str, str]:
    """Return tests/embedded_too.toml's entries: a test path (a file, or a directory ending in '/') to its rule."""
    with EMBEDDED_TOO_FILE.open("rb") as file:
        data = tomllib.load(file)
    unknown = [entry["path"] for entry in data["embedded_too"] if entry["rule"] not in data["rules"]]
    if unknown:
        raise pytest.UsageError(f"{EMBEDDED_TOO_FILE.name}: no such rule for {', '.join(unknown)}")
    return {entry["path"]: entry["rule"] for entry in data["embedded_too"]}


def runs_embedded_too(nodeid: str, paths: Collection[str]) -> bool:
    """Return whether the test `nodeid` lies in one of `paths` (files, or directories ending in '/')."""
    path = nodeid.split("::", 1)[0]
    return any(path == entry or (entry.endswith("/") and path.startswith(entry)) for entry in paths)


def in_scope(item: pytest.Item, scope: str, paths: Collection[str]) -> bool:
    """Return whether GPUCLOUD_TESTS=`scope` runs the test `item`."""
    if scope == "all":
        return True
    if scope == "backend-dependent":
        return touches_backends(item)
    return not touches_backends(item) or runs_embedded_too(item.nodeid, paths)


# Files that take minutes, started first: pytest-xdist hands whole files out in collection order (--dist
# loadfile), and one of these handed out last is a tail the other workers wait through. Measured under CI.
SLOW_FILES = (
    "tests/faults/test_faults.py",
    "tests/inventory/test_gang_multihost.py",
    "tests/browser/test_journey_data_scientist.py",
    "tests/browser/test_storage.py",
    "tests/api/test_fuzz.py",
    "tests/gpucloud/test_up_newcomer.py",
    "tests/inventory/test_remote_agent_e2e.py",
    "tests/gpucloud/test_up.py",
)


def _slow_first(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return SLOW_FILES.index(path) if path in SLOW_FILES else len(SLOW_FILES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_slow_first)  # stable: each file's tests keep their order
    scope = os.environ.get("GPUCLOUD_TESTS", "all")
    if scope not in TEST_SCOPES:
        raise pytest.UsageError(f"GPUCLOUD_TESTS={scope!r}: it must be one of {', '.join(TEST_SCOPES)}")
    if scope == "all":
        return
    paths = embedded_too() if scope == "embedded" else {}
    left = [item for item in items if not in_scope(item, scope, paths)]
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = [item for item in items if in_scope(item, scope, paths)]


def pytest_runtest_setup(item: pytest.Item) -> None:
    for service in SERVICES:
        if item.get_closest_marker(service) is None:
            continue
        reason = _missing(service)
        if reason is None:
            continue
        if service in REQUIRED or REQUIRED_WITH.get(service) in REQUIRED:
            pytest.fail(f"{service} is required (GPUCLOUD_REQUIRE_SERVICES) but missing: {reason}", pytrace=False)
        pytest.skip(f"{service} unavailable: {reason}")


@pytest.fixture(autouse=True)
def _registry_on_loopback_allowed(request: pytest.FixtureRequest) -> None:
    """Tests marked `registry` pull from a registry on 127.0.0.1 (a free port each): the operator's allowance
    that such a registry needs (IMAGE_REGISTRIES_ALLOWED, jobs.services.registries) is theirs."""
    if request.node.get_closest_marker("registry") is not None:
        request.getfixturevalue("settings").IMAGE_REGISTRIES_ALLOWED = ["127.0.0.1"]


@pytest.fixture(scope="session")
def test_image() -> str:
    """Return the local image Docker tests run, building it (from busybox-static, no pull) when missing."""
    subprocess.run([str(ROOT / ".ci" / "build-test-image"), TEST_IMAGE], check=True, timeout=120)
    return TEST_IMAGE


@pytest.fixture
def workload_tmp(settings: Any) -> Iterator[Path]:
    """A directory for a process-runtime agent's work and the test's volumes that a workload's user can reach.

    As root, the runtime runs workloads as unprivileged users, who cannot pass
    through pytest's private temporary directories (tests/process_user.py).
    """
    base = reachable_dir()
    settings.STORAGE_ROOT = base / "volumes"
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(autouse=True)
def _test_settings(settings: Any, tmp_path: Path) -> None:
    # Every test's volumes in a directory of its own, never the checkout's data directory.
    settings.STORAGE_ROOT = tmp_path / "volumes"
    # A deliberately slow password hash would dominate the suite's run time;
    # the production hasher is what `gpucloud up` (tests/gpucloud/test_up.py) uses.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    # django-axes' handler keeps the cache it was made with: setting AXES_HANDLER makes a new one, in this namespace.
    settings.AXES_HANDLER = settings.AXES_HANDLER
    # Login lockout and API throttles are on only in the tests of them (tests/frontend/test_pages.py,
    # tests/tenants/test_admin.py, tests/api/test_throttling.py): Django's test client logs in without a
    # request, which axes refuses, and the fuzz and other tests send thousands of requests a minute.
    settings.AXES_ENABLED = False
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": dict.fromkeys(settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]),
    }
    # Tests render templates without running collectstatic; the manifest
    # storage of production is exercised by tests/gpucloud/test_up.py.
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }


@pytest.fixture(autouse=True)
def _cache_namespace() -> Iterator[None]:
    """A fresh cache namespace per test, so login throttling and other cached state never leak between tests,
    nor between runs sharing one Redis: the prefix changes in place, read by tests/cache_keys.py."""
    caches = settings.CACHES
    before = {name: config.get("KEY_PREFIX") for name, config in caches.items()}
    for config in caches.values():
        config["KEY_PREFIX"] = f"test-{uuid.uuid4().hex}"
    yield
    for name, prefix in before.items():
        if name not in caches:
            continue
        if prefix is None:
            caches[name].pop("KEY_PREFIX", None)
        else:
            caches[name]["KEY_PREFIX"] = prefix


@pytest.fixture(autouse=True)
def _no_leftover_scope() -> Iterator[None]:
    yield
    deactivate_tenant()


@dataclass
class World:
    """The persona world every permission test starts from."""

    operator: User
    admin_a: User
    member_a: User
    viewer_a: User
    admin_b: User
    tenant_a: Tenant
    tenant_b: Tenant
    project_a: Project
    project_b: Project
    pool: NodePool
    quota_a: TenantQuota


def _user(username: str, *, staff: bool = False) -> User:
    return User.objects.create_user(username, f"{username}@example.com", PASSWORD, is_staff=staff, is_superuser=staff)


@pytest.fixture
def world(db: None) -> World:
    operator = _user("operator", staff=True)
    tenant_a = Tenant.objects.create(slug="tenant-a", name="Tenant A")
    tenant_b = Tenant.objects.create(slug="tenant-b", name="Tenant B")
    users = {name: _user(name) for name in ("admin_a", "member_a", "viewer_a", "admin_b")}
    for name, tenant, role in (
        ("admin_a", tenant_a, "admin"),
        ("member_a", tenant_a, "member"),
        ("viewer_a", tenant_a, "viewer"),
        ("admin_b", tenant_b, "admin"),
    ):
        Membership.all_tenants.create(tenant=tenant, user=users[name], role=role)
    pool = NodePool.objects.create(name="shared", description="Shared pool")
    return World(
        operator=operator,
        tenant_a=tenant_a,
        tenant_b=tenant_b,
        project_a=Project.all_tenants.create(tenant=tenant_a, slug="alpha", name="Alpha"),
        project_b=Project.all_tenants.create(tenant=tenant_b, slug="beta", name="Beta"),
        pool=pool,
        quota_a=TenantQuota.all_tenants.create(tenant=tenant_a, pool=pool, guaranteed=8, limit=16, weight=1),
        **users,
    )


@pytest.fixture
def api() -> APIClient:
    return APIClient()


def client_for(user: User | None) -> APIClient:
    """Return an API client logged in as `user` (anonymous for None)."""
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


def actor(user: User) -> Actor:
    return Actor(user=user)
