"""A private image registry for tests: Debian's `docker-registry` (the distribution registry v2) on 127.0.0.1.

Docker Hub is out of reach and no test pulls from it. A test that needs a
real pull starts a registry of its own (`running_registry`: a free loopback
port, its storage in a temporary directory), pushes an image made here to it
(`push_unique_image`) and removes the local copy, so the Docker engine really
downloads it. Registries on 127.0.0.0/8 need no TLS: the engine allows them
insecure by default.

`SlowLink` sits between the engine and a registry and passes what the
registry sends at a fixed rate, so a pull takes long enough to report
progress along the way, or to outlast a start's time budget.

Tests that use these are marked `registry` (tests/conftest.py): without the
binary they skip, and they fail where CI requires Docker.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

REGISTRY_BINARY = "docker-registry"
REGISTRY_PACKAGE = "docker-registry"
START_SECONDS = 15.0


def registry_missing() -> str | None:
    """Return why no registry can be served here, or None when the binary is installed."""
    if shutil.which(REGISTRY_BINARY) is None:
        return f"no {REGISTRY_BINARY} binary (Debian: {REGISTRY_PACKAGE})"
    return None


def free_port() -> int:
    """Return a TCP port free on 127.0.0.1 right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Registry:
    """A registry serving at `address` (`127.0.0.1:PORT`)."""

    address: str

    def ref(self, repository: str, tag: str = "latest") -> str:
        """Return the image reference of `repository:tag` in this registry."""
        return f"{self.address}/{repository}:{tag}"


_CONFIG = """\
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""


@contextmanager
def running_registry(directory: Path) -> Iterator[Registry]:
    """Serve a registry storing its blobs under `directory` for the block; stop it afterwards.

    Raises RuntimeError when it does not answer `/v2/` within START_SECONDS
    (its output, kept in `directory/registry.log`, says why).
    """
    port = free_port()
    config = directory / "registry.yml"
    config.write_text(_CONFIG.format(root=directory / "blobs", port=port))
    log_path = directory / "registry.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([str(shutil.which(REGISTRY_BINARY)), "serve", str(config)], stdout=log, stderr=log)
    try:
        _await_answer(f"http://127.0.0.1:{port}/v2/", process, log_path)
        yield Registry(f"127.0.0.1:{port}")
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _await_answer(url: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        with suppress(OSError, urllib.error.URLError), urllib.request.urlopen(url, timeout=2) as answer:  # noqa: S310 -- a loopback http:// URL made above
            if answer.status == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"the registry did not answer {url}: {log_path.read_text()[-2000:]}")


def docker(*args: str, timeout: float = 120.0) -> str:
    """Run the docker CLI with `args`; return its output. Raises CalledProcessError on failure."""
    done = subprocess.run(
        [str(shutil.which("docker")), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, ["docker", *args], done.stdout, done.stderr)
    return done.stdout


def push_unique_image(registry: Registry, base: str, *, payload_mb: int, repository: str = "") -> str:
    """Push to `registry` an image of `base` plus a layer of `payload_mb` MB of random bytes; return its reference.

    The local copy is removed afterwards, so the engine has to download
    the new layer to run it (the base's layer stays: other tests run
    `base`, and the pull reports it as already there). Random bytes do not
    compress, so the download is about `payload_mb` MB.
    """
    ref = registry.ref(repository or f"gpucloud-test/pull-{uuid.uuid4().hex[:10]}")
    builder = f"gpucloud-test-push-{uuid.uuid4().hex[:10]}"
    script = f"head -c {payload_mb * 1024 * 1024} /dev/urandom > /payload"
    docker("run", "--name", builder, "--network", "none", "--user", "0", base, "sh", "-c", script)
    try:
        docker("commit", builder, ref)
    finally:
        docker("rm", "-f", builder)
    try:
        docker("push", ref, timeout=300)
    finally:
        docker("rmi", ref)
    return ref


def remove_image(ref: str) -> None:
    """Remove the local copy of `ref` if there is one (what a pull made)."""
    with suppress(subprocess.CalledProcessError):
        docker("rmi", "--force", ref)


class SlowLink:
    """A TCP relay on 127.0.0.1 to `target` that passes what the target sends at `bytes_per_second`.

    What the client sends passes at full speed. `address` is where to
    connect instead of the target; `close` stops accepting and ends every
    relayed connection.
    """

    CHUNK = 16 * 1024

    def __init__(self, target: str, bytes_per_second: int) -> None:
        host, _, port = target.rpartition(":")
        self._target = (host, int(port))
        self._rate = bytes_per_second
        self._server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._server.getsockname()[1]}"
        self._sockets: list[socket.socket] = [self._server]
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name="slow-link", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target, timeout=10)
            upstream.settimeout(None)
            self._sockets += [client, upstream]
            threading.Thread(target=self._relay, args=(client, upstream, 0), daemon=True).start()
            threading.Thread(target=self._relay, args=(upstream, client, self._rate), daemon=True).start()

    def _relay(self, source: socket.socket, sink: socket.socket, rate: int) -> None:
        with suppress(OSError):
            while not self._closed.is_set():
                data = source.recv(self.CHUNK)
                if not data:
                    break
                sink.sendall(data)
                if rate:
                    time.sleep(len(data) / rate)
        with suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed.set()
        for sock in self._sockets:
            with suppress(OSError):
                sock.close()


@contextmanager
def slow_image_of(registry: Registry, base: str, *, payload_mb: int = 4, rate: int = 2 * 1024 * 1024) -> Iterator[str]:
    """Yield the reference of a `payload_mb` image the engine does not have, reached through a link passing
    `rate` bytes a second (so a pull takes seconds); remove what was pulled of it afterwards."""
    ref = push_unique_image(registry, base, payload_mb=payload_mb)
    link = SlowLink(registry.address, rate)
    slow = ref.replace(registry.address, link.address)
    try:
        yield slow
    finally:
        link.close()
        remove_image(slow)
