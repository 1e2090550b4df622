"""Postgres and Redis for the fault suite: the shared servers (never restarted), and private ones that are.

The shared servers (Postgres on 5432, Redis on 6379) serve everyone on the
machine: the suite only creates and drops its own databases there
(`gpucloud_faults_*`) and uses its own Redis database (3 unless told
otherwise). Faults that restart Postgres or Redis run against private
servers started here on other ports (Redis with no persistence, so a
restart loses every queued message, as a crashed transport does).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from _faults.procs import Proc, wait_until

SHARED_DATABASE = "postgres://gpucloud:gpucloud@127.0.0.1:5432/postgres"
SHARED_REDIS = "redis://127.0.0.1:6379/3"
PRIVATE_REDIS_PORT = 6390
PRIVATE_POSTGRES_PORT = 5440
PRIVATE_POSTGRES_DIR = Path("/tmp/faults-pg")  # noqa: S108 -- a scratch cluster owned by the postgres user
PG_BIN = Path("/usr/lib/postgresql/15/bin")
# The private engine's socket, data and exec roots: one per harness process, short enough for a socket path.
PRIVATE_DOCKER_DIR = Path(f"/tmp/faults-docker-{os.getpid()}")  # noqa: S108
# Outside Docker's default pools (172.17-31.0.0/16, 192.168.0.0/16), which the host's shared engine uses.
PRIVATE_ADDRESS_POOL = "base=10.213.0.0/16,size=24"


def with_database(url: str, name: str) -> str:
    """Return the Postgres `url` naming database `name` instead."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def postgres_answers(url: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(with_database(url, "postgres"), connect_timeout=3) as connection:
            connection.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_timeout=3, socket_connect_timeout=3).ping())
    except redis.RedisError:
        return False


def wait_for_shared(database: str, redis_url: str, timeout: float) -> None:
    """Wait until the shared Postgres and Redis answer; exit naming the one that does not."""
    if not wait_until(lambda: postgres_answers(database), timeout, interval=2):
        raise SystemExit(f"Postgres at {database} did not answer within {timeout:g} s")
    if not wait_until(lambda: redis_answers(redis_url), timeout, interval=2):
        raise SystemExit(f"Redis at {redis_url} did not answer within {timeout:g} s")


def fresh_database(server_url: str, name: str) -> str:
    """Drop and create database `name` on the server of `server_url`; return its URL."""
    import psycopg

    if not name.startswith("gpucloud_faults"):
        raise ValueError(f"the fault suite only touches its own databases (gpucloud_faults*), not {name}")
    with psycopg.connect(with_database(server_url, "postgres"), autocommit=True, connect_timeout=10) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')
    return with_database(server_url, name)


def drop_database(url: str) -> None:
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    if not name.startswith("gpucloud_faults"):
        return
    with (
        contextlib.suppress(psycopg.Error),
        psycopg.connect(with_database(url, "postgres"), autocommit=True, connect_timeout=10) as connection,
    ):
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def flush_redis(url: str) -> None:
    """Empty the one Redis database `url` names (the suite's own: never 0, 1 or 2 of the shared server)."""
    import redis

    client = redis.Redis.from_url(url)
    database = int(client.connection_pool.connection_kwargs.get("db", 0))
    port = int(client.connection_pool.connection_kwargs.get("port", 6379))
    if port == 6379 and database in (0, 1, 2):
        raise ValueError(f"refusing to flush Redis database {database} of the shared server: others use it")
    client.flushdb()


class PrivateRedis:
    """A redis-server of the suite's own on PRIVATE_REDIS_PORT, without persistence; restartable."""

    def __init__(self, run_dir: Path, port: int = PRIVATE_REDIS_PORT) -> None:
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/3"
        argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = Proc(f"redis-{port}", argv, env=dict(os.environ), cwd=run_dir, log_dir=run_dir)

    def start(self) -> None:
        self.proc.start()
        if not wait_until(lambda: redis_answers(self.url), 20):
            raise RuntimeError(f"private Redis on {self.port} did not start:\n{self.proc.tail()}")

    def kill9(self) -> None:
        self.proc.kill9()

    def stop(self) -> None:
        self.proc.stop(timeout=5)


class PrivatePostgres:
    """A Postgres 15 cluster of the suite's own in PRIVATE_POSTGRES_DIR on PRIVATE_POSTGRES_PORT; restartable.

    Run as the `postgres` user (the suite runs as root); trust authentication
    on loopback, superuser `gpucloud`. An immediate stop is Postgres's crash:
    no checkpoint, every connection cut, recovery from the WAL at start.
    """

    def __init__(self, root: Path = PRIVATE_POSTGRES_DIR, port: int = PRIVATE_POSTGRES_PORT) -> None:
        self.root = root
        self.data = root / "data"
        self.port = port
        self.url = f"postgres://gpucloud:gpucloud@127.0.0.1:{port}/postgres"

    def _as_postgres(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else list(argv)
        return subprocess.run(command, capture_output=True, text=True, check=check, timeout=120)

    def start(self) -> None:
        if not (self.data / "PG_VERSION").exists():
            shutil.rmtree(self.root, ignore_errors=True)
            self.root.mkdir(parents=True)
            if os.geteuid() == 0:
                shutil.chown(self.root, "postgres", "postgres")
            self._as_postgres(str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "gpucloud", "-A", "trust")
        self._pg_ctl_start()

    def _pg_ctl_start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._as_postgres(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.root / "log"), "-w", "start"
        )
        if not wait_until(lambda: postgres_answers(self.url), 60, interval=0.5):
            raise RuntimeError(f"private Postgres on {self.port} did not answer; see {self.root / 'log'}")

    def crash(self) -> None:
        """Stop in immediate mode: every backend ends at once, nothing is checkpointed."""
        self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)

    def restart_after_crash(self) -> None:
        self._pg_ctl_start()

    def stop(self) -> None:
        self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)
        time.sleep(0.5)


class PrivateDocker:
    """A Docker Engine of the suite's own (socket, data and exec roots under PRIVATE_DOCKER_DIR); restartable.

    No iptables (the shared engine owns the host's rules), a default bridge
    of its own name, address pools of its own (so its bridges never take the
    shared engine's), and live restore on, as production engines run: a daemon
    restart leaves the containers running. SIGKILL reaches dockerd alone
    (its containerd runs in a process group of its own), as when the
    daemon crashes. The test image is built into it from busybox-static.
    """

    def __init__(self, run_dir: Path, root: Path = PRIVATE_DOCKER_DIR) -> None:
        self.root = root
        self.url = f"unix://{root / 'docker.sock'}"
        # Never `--bridge none`: an engine started so deletes the interface `docker0` on its way up, the
        # shared engine's default bridge, and every later build or container on the shared engine fails
        # ("could not find bridge docker0"). A bridge of its own keeps its hands off the host's.
        self.bridge = "gcpd" + hashlib.sha256(str(root).encode()).hexdigest()[:10]
        argv = [
            "dockerd",
            "--host",
            self.url,
            "--data-root",
            str(root / "data"),
            "--exec-root",
            str(root / "exec"),
            "--pidfile",
            str(root / "docker.pid"),
            "--bridge",
            self.bridge,
            "--iptables=false",
            "--ip6tables=false",
            "--ip-masq=false",
            "--default-address-pool",
            PRIVATE_ADDRESS_POOL,
            "--live-restore",
        ]
        self.proc = Proc("dockerd", argv, env=dict(os.environ), cwd=run_dir, log_dir=run_dir)

    def _docker(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "DOCKER_HOST": self.url}
        return subprocess.run(["docker", *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)

    def answers(self) -> bool:
        try:
            return self._docker("info", timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        # dockerd takes a bridge of a name other than docker0 only when it exists; its address comes from the pool.
        if not Path(f"/sys/class/net/{self.bridge}").exists():
            subprocess.run(
                ["ip", "link", "add", self.bridge, "type", "bridge"], check=True, capture_output=True, timeout=30
            )
        self.proc.start()
        if not wait_until(self.answers, 60, interval=0.5):
            raise RuntimeError(f"the private Docker Engine did not answer:\n{self.proc.tail()}")

    def build_image(self, script: Path, image: str) -> None:
        env = {**os.environ, "DOCKER_HOST": self.url}
        subprocess.run([str(script), image], env=env, check=True, capture_output=True, timeout=300)

    def kill9(self) -> None:
        self.proc.kill9()

    def finished_at(self) -> dict[str, float]:
        """Return {container name: when it exited, epoch seconds} for every exited container of the engine."""
        names = self._docker("ps", "-aq", "--filter", "status=exited").stdout.split()
        if not names:
            return {}
        shown = self._docker("inspect", "--format", "{{.Name}} {{.State.FinishedAt}}", *names).stdout
        found: dict[str, float] = {}
        for line in shown.splitlines():
            name, _, stamp = line.strip().partition(" ")
            with contextlib.suppress(ValueError):
                # RFC 3339 with nanoseconds; seconds are precise enough to place an exit in an outage.
                moment = datetime.datetime.fromisoformat(stamp[:26].rstrip("Z") + "+00:00")
                found[name.lstrip("/")] = moment.timestamp()
        return found

    def stop(self) -> None:
        """Remove every container and network, stop the daemon, then end whatever of the engine outlived it.

        A daemon killed and restarted can leave its first containerd and
        container shims behind; they are found by the private root in their
        command lines. Its bridges are kernel interfaces that outlive the
        daemon and its data root: left behind, their routes would use up the
        address pools of every engine on the host.
        """
        bridges: list[str] = []
        if self.answers():
            listed = self._docker("ps", "-aq").stdout.split()
            if listed:
                self._docker("rm", "-f", *listed)
            networks = self._docker("network", "ls", "-q", "--filter", "driver=bridge").stdout.split()
            bridges = [f"br-{network[:12]}" for network in networks]
            self._docker("network", "prune", "-f")
        self.proc.stop(timeout=30)
        for bridge in [*bridges, self.bridge] if shutil.which("ip") else []:
            subprocess.run(["ip", "link", "delete", bridge], capture_output=True, check=False, timeout=30)
        marker = str(self.root).encode() + b"/"
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                with contextlib.suppress(OSError):
                    if marker in (entry / "cmdline").read_bytes():
                        os.kill(int(entry.name), signal.SIGTERM)
        time.sleep(1)
        # dockerd bind-mounts its data root (and network namespaces) under the root: unmount before removing.
        prefix = f"{self.root}/"
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(prefix)), reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False, timeout=30)
        shutil.rmtree(self.root, ignore_errors=True)
