"""A real shared filesystem: one directory served by sshd on 127.0.0.1, mounted twice with sshfs.

The two mounts stand for two hosts that mount the same share at their own
path: the console's view and a node's view. A volume made through the
console's view is bound into a real container through the node's view,
and what the container writes is read back through the console's.

sshfs because this kernel has neither an NFS nor a CIFS client (see
/proc/filesystems): FUSE is the one network filesystem it can mount. The
caches are off (like NFS with `actimeo=0`), so each view sees the other's
writes at once.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from inventory.drivers import storage
from inventory.drivers.base import Mount, RunAs
from inventory.drivers.docker import DockerRuntime
from inventory.drivers.storage import MARKER_FILE, StorageNotMounted
from tests.inventory.drivers.conftest import SpecFactory, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.sshfs]

MARKER = "backend-shared-test"


def _tool(name: str) -> str:
    """Return the absolute path of `name` (sshd lives in /usr/sbin, often off a user's PATH)."""
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin") or name


NO_CACHE = "dir_cache=no,entry_timeout=0,attr_timeout=0,negative_timeout=0"


@dataclass(frozen=True)
class Share:
    """The exported directory and the paths two hosts mount it at."""

    export: Path
    console: Path
    node: Path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as connection:
            return connection.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def _sshd(base: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Start sshd in the foreground on a free loopback port, accepting only a key made here."""
    for name in ("host", "user"):
        keygen = [_tool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-f", str(base / name)]
        subprocess.run(keygen, check=True, timeout=30)
    shutil.copy(base / "user.pub", base / "authorized_keys")
    port = _free_port()
    (base / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {base / 'host'}\n"
        f"AuthorizedKeysFile {base / 'authorized_keys'}\nPidFile {base / 'sshd.pid'}\n"
        "StrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\nSubsystem sftp internal-sftp\n"
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # its privilege separation directory
    log = (base / "sshd.log").open("wb")
    server = subprocess.Popen([_tool("sshd"), "-D", "-e", "-f", str(base / "sshd_config")], stdout=log, stderr=log)
    if not wait_for(lambda: _answers(port) or server.poll() is not None, timeout=15) or server.poll() is not None:
        server.kill()
        pytest.fail(f"sshd did not come up: {(base / 'sshd.log').read_text()}")
    return server, port


def _mount(base: Path, port: int, export: Path, at: Path) -> None:
    at.mkdir()
    options = f"IdentityFile={base / 'user'},StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,BatchMode=yes"
    remote = f"root@127.0.0.1:{export}"
    command = [_tool("sshfs"), "-p", str(port), "-o", f"{options},allow_other,{NO_CACHE}", remote, str(at)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        pytest.fail(f"sshfs could not mount {export}: {done.stderr.strip()}")


def _unmount(at: Path) -> None:
    for _ in range(50):
        unmounted = subprocess.run([_tool("fusermount3"), "-u", str(at)], capture_output=True, timeout=30, check=False)
        if unmounted.returncode == 0:
            return
        time.sleep(0.1)  # still busy: a container that used it is being torn down
    subprocess.run([_tool("fusermount3"), "-uz", str(at)], capture_output=True, timeout=30, check=False)


@pytest.fixture(scope="module")
def share(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Share]:
    base = tmp_path_factory.mktemp("sshfs")
    export = base / "export"
    export.mkdir()
    (export / MARKER_FILE).write_text(MARKER + "\n")
    server, port = _sshd(base)
    views = Share(export, base / "console", base / "node")
    mounted: list[Path] = []
    try:
        for view in (views.console, views.node):
            _mount(base, port, export, view)
            mounted.append(view)
        yield views
    finally:
        for view in mounted:
            _unmount(view)
        server.terminate()
        server.wait(timeout=10)


def test_a_volume_made_by_the_console_is_written_by_a_container_on_a_node_and_read_back(
    share: Share, runtime: DockerRuntime, docker_spec: SpecFactory
) -> None:
    assert os.path.ismount(share.console) and os.path.ismount(share.node)
    relative = "t1/projects/p"
    console_view = Mount(f"{share.console}/{relative}", "/", root=str(share.console), marker=MARKER)
    console_dir = storage.SharedFilesystem().prepare(console_view, RunAs(0, 3000), 0o2770)
    storage.write_file(console_dir, "input.txt", [b"from the console\n"], 1 << 20)
    assert (share.export / relative / "input.txt").read_text() == "from the console\n", "it went to the share"
    mount = Mount(f"{share.node}/{relative}", "/projects/p", root=str(share.node), marker=MARKER)
    script = "cat /projects/p/input.txt; mkdir /projects/p/out; echo from the node > /projects/p/out/result.txt"
    handle = runtime.start(docker_spec(["sh", "-c", script], mounts=(mount,), run_as=RunAs(1001, 3000)))
    assert wait_for(lambda: runtime.poll(handle).state == "exited", timeout=20)
    status = runtime.poll(handle)
    output = [line.text for line in runtime.logs(handle)]
    assert status.exit_code == 0, output
    assert output == ["from the console"]
    assert [entry.name for entry in storage.list_dir(console_dir, "out")] == ["result.txt"]
    with storage.open_read(console_dir, "out/result.txt") as file:
        assert file.read() == b"from the node\n"
    found = os.stat(share.export / relative)
    assert (found.st_gid, found.st_mode & 0o7777) == (3000, 0o2770), "the owner and mode reached the share"
    assert storage.usage(console_dir) == len(b"from the console\n") + 14


def test_a_host_where_the_share_is_not_mounted_makes_nothing_on_its_own_disk(
    share: Share, runtime: DockerRuntime, docker_spec: SpecFactory, tmp_path: Path
) -> None:
    unmounted = tmp_path / "mnt-shared"  # the mount point of a host whose share did not come up
    unmounted.mkdir()
    mount = Mount(f"{unmounted}/t1/projects/p", "/projects/p", root=str(unmounted), marker=MARKER)
    with pytest.raises(StorageNotMounted, match=f"is not mounted on this host: no marker at {unmounted}/{MARKER_FILE}"):
        runtime.start(docker_spec(["true"], mounts=(mount,)))
    assert list(unmounted.iterdir()) == []
