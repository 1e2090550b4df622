"""Volumes in real containers: the home read-write as the user, a dataset truly read-only, the stop signal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker
import pytest

from inventory.drivers.base import Mount, RunAs
from inventory.drivers.docker import DockerRuntime
from inventory.drivers.storage import MARKER_FILE, PathRefused, StorageNotMounted
from tests.inventory.drivers.conftest import SpecFactory, wait_for

# Volumes are given to their uid, which needs root: without it these fail, never skip.
pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("as_root")]

USER = RunAs(1001, 2001, (1001, 2000))
TRAPS_USR1 = (
    "trap 'echo got-usr1; exit 0' USR1; trap 'echo got-term; exit 9' TERM; echo ready; while :; do sleep 0.05; done"
)


def texts(runtime: DockerRuntime, handle: dict[str, Any], stream: str = "stdout") -> list[str]:
    """Return one stream's lines: Docker stamps each stream as it reads it, so only their order within it holds."""
    return [line.text for line in runtime.logs(handle) if line.stream == stream]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    place = tmp_path / "storage"
    place.mkdir()
    return place


def home_and_dataset(root: Path) -> tuple[Mount, Mount]:
    home = Mount(str(root / "t1" / "homes" / "alice"), "/home/alice", root=str(root), uid=1001, gid=1001, mode=0o700)
    dataset = root / "t1" / "datasets" / "d"
    dataset.mkdir(parents=True)
    (dataset / "readme").write_text("the data\n")
    # Writable by everyone on the host: only the read-only mount can stop the workload from writing.
    dataset.chmod(0o777)
    return home, Mount(str(dataset), "/datasets/d", read_only=True, root=str(root))


def test_the_home_is_written_as_the_user_and_a_read_only_dataset_cannot_be_written(
    runtime: DockerRuntime, docker_spec: SpecFactory, docker_client: docker.DockerClient, root: Path
) -> None:
    home, dataset = home_and_dataset(root)
    script = (
        "id -u; id -g; id -G; pwd; echo $HOME; echo hello > notes.txt; cat /datasets/d/readme;"
        " if echo x > /datasets/d/new; then echo dataset-written; fi; ls /datasets"
    )
    spec = docker_spec(["sh", "-c", script], mounts=(home, dataset), run_as=USER, workdir="/home/alice")
    handle = runtime.start(spec)
    assert wait_for(lambda: runtime.poll(handle).state == "exited")
    assert texts(runtime, handle) == ["1001", "2001", "2001 1001 2000", "/home/alice", "/home/alice", "the data", "d"]
    assert texts(runtime, handle, "stderr") == ["sh: can't create /datasets/d/new: Read-only file system"]
    assert not Path(dataset.source, "new").exists()
    notes = Path(home.source, "notes.txt")
    assert notes.read_text() == "hello\n"
    assert (notes.stat().st_uid, notes.stat().st_gid) == (1001, 2001), "the user's files are the user's on the host"
    made = Path(home.source).stat()
    assert (made.st_uid, made.st_gid, made.st_mode & 0o7777) == (1001, 1001, 0o700)
    mounts = docker_client.api.inspect_container(handle["id"])["Mounts"]
    assert sorted((m["Source"], m["Destination"], m["RW"]) for m in mounts) == [
        (dataset.source, "/datasets/d", False),
        (home.source, "/home/alice", True),
    ], "only the volume directories of the host are reachable"


def test_stop_sends_the_signal_the_spec_names(runtime: DockerRuntime, docker_spec: SpecFactory) -> None:
    handle = runtime.start(docker_spec(["sh", "-c", TRAPS_USR1], stop_signal="SIGUSR1"))
    assert wait_for(lambda: "ready" in texts(runtime, handle))
    status = runtime.stop(handle, grace_seconds=10)
    assert (status.state, status.exit_code) == ("exited", 0)
    assert texts(runtime, handle)[-1] == "got-usr1"


def test_a_shared_storage_that_is_not_mounted_stops_the_start_before_any_container(
    runtime: DockerRuntime, docker_spec: SpecFactory, docker_client: docker.DockerClient, root: Path
) -> None:
    mount = Mount(str(root / "t1" / "v"), "/projects/v", root=str(root), marker="backend-1")
    spec = docker_spec(["true"], mounts=(mount,))
    with pytest.raises(StorageNotMounted, match=f"no marker at {root}/{MARKER_FILE}"):
        runtime.start(spec)
    assert not docker_client.api.containers(all=True, filters={"name": spec.name})
    assert not (root / "t1").exists()
    (root / MARKER_FILE).write_text("backend-1\n")
    handle = runtime.start(spec)
    assert wait_for(lambda: runtime.poll(handle).state == "exited")
    assert (root / "t1" / "v").is_dir()


def test_a_volume_that_leads_out_of_its_root_through_a_symlink_is_refused(
    runtime: DockerRuntime, docker_spec: SpecFactory, docker_client: docker.DockerClient, root: Path, tmp_path: Path
) -> None:
    (root / "t1").symlink_to(tmp_path)
    spec = docker_spec(["true"], mounts=(Mount(str(root / "t1" / "v"), "/projects/v", root=str(root)),))
    with pytest.raises(PathRefused, match="symbolic link"):
        runtime.start(spec)
    assert not docker_client.api.containers(all=True, filters={"name": spec.name})
    assert not (tmp_path / "v").exists()


def test_each_members_checkpoint_directory_is_ready_and_writable_on_a_shared_project_volume(
    runtime: DockerRuntime, docker_spec: SpecFactory, root: Path
) -> None:
    """Two members of one project (same group, their own uids): whoever's job came first, both can checkpoint."""
    project = str(root / "t1" / "projects" / "p")

    def project_volume(workload_id: int) -> Mount:
        return Mount(
            project,
            "/projects/p",
            root=str(root),
            uid=0,
            gid=2001,
            mode=0o2770,
            subdirs=(f".checkpoints/{workload_id}",),
        )

    outputs = []
    for workload_id, user in ((7, USER), (8, RunAs(1002, 2001, (1002, 2001)))):
        script = f"echo step-{workload_id} > /projects/p/.checkpoints/{workload_id}/latest && echo saved"
        handle = runtime.start(docker_spec(["sh", "-c", script], mounts=(project_volume(workload_id),), run_as=user))
        assert wait_for(lambda handle=handle: runtime.poll(handle).state == "exited")  # type: ignore[misc]
        outputs.append((texts(runtime, handle), texts(runtime, handle, "stderr")))
    assert outputs == [(["saved"], []), (["saved"], [])], "the second member was not locked out by the first"
    for workload_id in (7, 8):
        made = Path(project, ".checkpoints", str(workload_id)).stat()
        assert (made.st_uid, made.st_gid, made.st_mode & 0o7777) == (0, 2001, 0o2770)
    shared = Path(project, ".checkpoints").stat()
    assert (shared.st_gid, shared.st_mode & 0o7777) == (2001, 0o2770)


def test_a_checkpoint_directory_that_leads_out_of_its_volume_is_refused(
    runtime: DockerRuntime, docker_spec: SpecFactory, root: Path, tmp_path: Path
) -> None:
    project = root / "t1" / "projects" / "p"
    project.mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (project / ".checkpoints").symlink_to(outside)
    mount = Mount(
        str(project), "/projects/p", root=str(root), uid=0, gid=2001, mode=0o2770, subdirs=(".checkpoints/7",)
    )
    with pytest.raises(PathRefused):
        runtime.start(docker_spec(["true"], mounts=(mount,), run_as=USER))
    assert list(outside.iterdir()) == [], "nothing was made through the symlink"
