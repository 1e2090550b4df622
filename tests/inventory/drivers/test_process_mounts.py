"""Volumes in the process runtime: the same layout under the workload directory, host paths, the stop signal."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inventory.drivers.base import Mount, RunAs, WorkloadSpec
from inventory.drivers.policy import SpecRefused
from inventory.drivers.process import ProcessRuntime
from inventory.drivers.process._workdir import ROOT, host_environment
from inventory.drivers.storage import MARKER_FILE, StorageNotMounted
from tests.inventory.drivers.conftest import new_spec, wait_for

TRAPS_USR1 = (
    "trap 'echo got-usr1; exit 0' USR1; trap 'echo got-term; exit 9' TERM; echo ready; while :; do sleep 0.05; done"
)


@pytest.fixture
def runtime(workload_tmp: Path) -> Iterator[ProcessRuntime]:
    runtime = ProcessRuntime(workload_tmp / "work", enabled=True)
    yield runtime
    for workload in runtime.list_managed():
        runtime.remove(workload.handle, timeout=5)


@pytest.fixture
def mounts(workload_tmp: Path) -> tuple[Mount, ...]:
    root = workload_tmp / "storage"
    dataset = root / "t1" / "datasets" / "d"
    dataset.mkdir(parents=True)
    (dataset / "readme").write_text("the data\n")
    return (
        Mount(str(root / "t1" / "homes" / "alice"), "/home/alice", root=str(root), uid=1001, gid=1001, mode=0o700),
        Mount(str(root / "t1" / "projects" / "p"), "/projects/p", root=str(root)),
        Mount(str(dataset), "/datasets/d", read_only=True, root=str(root)),
    )


def spec(command: str, **extra: Any) -> WorkloadSpec:
    return new_spec(["sh", "-c", command], tenant="acme", **extra)


def lines(runtime: ProcessRuntime, handle: dict[str, Any]) -> list[str]:
    """Return the standard output (the shell reports a child killed by the signal on stderr, in any order)."""
    return [line.text for line in runtime.logs(handle) if line.stream == "stdout"]


def test_the_volumes_are_laid_out_as_in_a_container_and_the_process_gets_host_paths(
    runtime: ProcessRuntime, mounts: tuple[Mount, ...]
) -> None:
    home, project, _ = mounts
    env = {"HOME": "/home/alice", "GPUCLOUD_CHECKPOINT_DIR": "/projects/p/.checkpoints/7", "OTHER": "/projects"}
    env["DATA"] = "/datasets/d"
    script = "pwd; echo $HOME; echo $GPUCLOUD_CHECKPOINT_DIR; echo $OTHER; cat $DATA/readme; echo hi > notes"
    handle = runtime.start(
        spec(script, mounts=mounts, workdir="/home/alice", env=env, run_as=RunAs(1001, 2001), stop_signal="SIGUSR1")
    )
    assert wait_for(lambda: runtime.poll(handle).state == "exited")
    assert runtime.poll(handle).exit_code == 0, lines(runtime, handle)
    sandbox = Path(handle["dir"]) / ROOT
    for mount in mounts:
        link = sandbox / mount.target.lstrip("/")
        assert link.is_symlink() and os.readlink(link) == mount.source
    checkpoint = f"{project.source}/.checkpoints/7"
    assert lines(runtime, handle) == [home.source, home.source, checkpoint, "/projects", "the data"]
    assert Path(home.source, "notes").read_text() == "hi\n"
    # A root agent gives the volume to the workload's user, as in a container; any other keeps it its own.
    assert os.stat(home.source).st_uid == (1001 if os.geteuid() == 0 else os.geteuid())


def test_removing_the_workload_keeps_its_volumes(runtime: ProcessRuntime, mounts: tuple[Mount, ...]) -> None:
    handle = runtime.start(spec("echo kept > keep", mounts=mounts, workdir="/home/alice", run_as=RunAs(1001, 1001)))
    assert wait_for(lambda: runtime.poll(handle).state == "exited")
    runtime.remove(handle)
    assert not Path(handle["dir"]).exists()
    assert Path(mounts[0].source, "keep").read_text() == "kept\n"
    assert Path(mounts[2].source, "readme").read_text() == "the data\n"


def test_a_workdir_outside_every_mount_is_made_under_the_sandbox_root(runtime: ProcessRuntime) -> None:
    handle = runtime.start(spec("pwd; echo $HOME", workdir="/workspace/run"))
    assert wait_for(lambda: runtime.poll(handle).state == "exited")
    expected = str(Path(handle["dir"]) / ROOT / "workspace" / "run")
    assert lines(runtime, handle) == [expected, expected]


def test_stop_sends_the_signal_the_spec_names_to_the_process_group(runtime: ProcessRuntime) -> None:
    handle = runtime.start(spec(TRAPS_USR1, stop_signal="SIGUSR1"))
    assert wait_for(lambda: "ready" in lines(runtime, handle))
    status = runtime.stop(handle, grace_seconds=10)
    assert (status.state, status.exit_code) == ("exited", 0)
    assert lines(runtime, handle)[-1] == "got-usr1"


def test_without_a_stop_signal_stop_sends_sigterm(runtime: ProcessRuntime) -> None:
    handle = runtime.start(spec(TRAPS_USR1))
    assert wait_for(lambda: "ready" in lines(runtime, handle))
    assert runtime.stop(handle, grace_seconds=10).exit_code == 9
    assert lines(runtime, handle)[-1] == "got-term"


def test_a_refused_sandbox_or_an_unmounted_share_runs_nothing(runtime: ProcessRuntime, workload_tmp: Path) -> None:
    with pytest.raises(SpecRefused):
        runtime.start(spec("true", stop_signal="SIGKILL"))
    share = workload_tmp / "share"
    share.mkdir()
    unmounted = Mount(str(share / "v"), "/projects/v", root=str(share), marker="m")
    with pytest.raises(StorageNotMounted, match=f"no marker at {share}/{MARKER_FILE}"):
        runtime.start(spec("true", mounts=(unmounted,)))
    assert not (share / "v").exists()


def test_only_whole_values_inside_a_mount_are_rewritten() -> None:
    mounts = (
        Mount("/srv/h/alice", "/home/alice", root="/srv/h"),
        Mount("/srv/p/deep", "/home/alice/deep", root="/srv/p"),
    )
    env = {"A": "/home/alice", "B": "/home/alice/x", "C": "/home/alice-2", "D": "/home/alice/deep/y"}
    env["E"] = "x:/home/alice"
    assert host_environment(env, mounts) == {
        "A": "/srv/h/alice",
        "B": "/srv/h/alice/x",
        "C": "/home/alice-2",
        "D": "/srv/p/deep/y",
        "E": "x:/home/alice",
    }
