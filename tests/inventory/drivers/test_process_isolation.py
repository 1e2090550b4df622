"""A root agent's process runtime keeps a tenant's code out of the console's data and other tenants' volumes.

The workload runs as its unprivileged user with exactly its groups; the
console's data directory is 0711 with its secret key and SQLite ledger
0600, volumes belong to their owners' uids, and another workload's
directory holds only root's 0600 files. Everything here is real: the tests
run as root and the workload really tries to read.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpucloud import env
from inventory.drivers.base import Handle, Mount, RunAs
from inventory.drivers.process import ProcessRuntime
from tests.inventory.drivers.conftest import new_spec, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the process runtime changes users only when run as root")

ALICE = RunAs(uid=200_002, gid=300_002, groups=(300_002,))  # tenant A's member in project A
BOB = RunAs(uid=200_001, gid=300_001, groups=(300_001,))  # tenant B's member in project B


@pytest.fixture
def data_dir(workload_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A console data directory as the console makes it: its secret key and a SQLite ledger holding a row."""
    monkeypatch.delenv("SECRET_KEY", raising=False)
    data = workload_tmp / "data"
    env.secret_key(data, required=False)
    env.private_file(data / "gpucloud.sqlite3")
    with (data / "gpucloud.sqlite3").open("r+") as ledger:
        ledger.write("ledger row\n")
    return data


@pytest.fixture
def runtime(data_dir: Path) -> Iterator[ProcessRuntime]:
    runtime = ProcessRuntime(data_dir / "agent" / "n1", enabled=True)
    yield runtime
    for workload in runtime.list_managed():
        runtime.remove(workload.handle, timeout=5)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _run(runtime: ProcessRuntime, script: str, **extra: Any) -> tuple[Handle, list[str]]:
    handle = runtime.start(new_spec(["sh", "-c", script], tenant="acme", **extra))
    assert wait_for(lambda: runtime.poll(handle).state == "exited")
    return handle, [line.text for line in runtime.logs(handle) if line.stream == "stdout"]


def test_the_data_directory_is_passable_only_and_the_secret_key_and_ledger_are_the_consoles_alone(
    data_dir: Path,
) -> None:
    assert _mode(data_dir) == 0o711
    assert _mode(data_dir / "secret_key") == 0o600
    assert _mode(data_dir / "gpucloud.sqlite3") == 0o600


def test_a_loose_data_directory_and_secret_key_left_by_an_older_version_are_tightened(
    workload_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SECRET_KEY", raising=False)
    data = workload_tmp / "old"
    data.mkdir(mode=0o755)
    (data / "secret_key").write_text("k" * 64)
    (data / "secret_key").chmod(0o644)
    assert env.secret_key(data, required=False) == "k" * 64
    assert (_mode(data), _mode(data / "secret_key")) == (0o711, 0o600)


def test_a_workload_cannot_read_the_secret_key_the_ledger_another_tenants_volume_or_workload(
    runtime: ProcessRuntime, data_dir: Path
) -> None:
    storage = data_dir / "volumes"
    volume = Mount(str(storage / "tb" / "projects" / "b"), "/projects/b", root=str(storage))
    theirs, said = _run(
        runtime, "echo tenant B data > notes; echo done", mounts=(volume,), workdir="/projects/b", run_as=BOB
    )
    assert said == ["done"] and Path(volume.source, "notes").read_text() == "tenant B data\n"
    targets = {
        "secret": data_dir / "secret_key",
        "ledger": data_dir / "gpucloud.sqlite3",
        "volume": Path(volume.source) / "notes",
        "their-log": Path(theirs["dir"]) / "log.jsonl",
        "their-launch": Path(theirs["dir"]) / "launch.json",
    }
    tries = "; ".join(
        f"cat {path} >/dev/null 2>&1 && echo READ {name} || echo DENIED {name}" for name, path in targets.items()
    )
    listing = f"ls {data_dir} >/dev/null 2>&1 && echo LISTED || echo UNLISTED"
    _, said = _run(runtime, f"id -u; id -G; {tries}; {listing}", run_as=ALICE)
    assert said[:2] == ["200002", "300002"], "runs as its user with exactly its groups"
    assert said[2:] == [f"DENIED {name}" for name in targets] + ["UNLISTED"]


def test_a_workload_naming_no_user_runs_as_nobody(runtime: ProcessRuntime) -> None:
    _, said = _run(runtime, "id -u; id -G")
    assert said == ["65534", "65534"]


def test_a_program_its_user_cannot_reach_is_refused_by_name_before_it_runs(workload_tmp: Path) -> None:
    """A script on PATH whose interpreter sits in a private directory (a venv's Python under /root) would exit
    126 as the workload's user; the start names the program and the closed directory instead."""
    from inventory.drivers.base import PermanentDriverError
    from inventory.drivers.process import NOBODY, check_runnable

    private, shared = workload_tmp / "private", workload_tmp / "bin"
    private.mkdir(mode=0o700)
    shared.mkdir(mode=0o755)
    interpreter = private / "python"
    interpreter.symlink_to("/bin/sh")
    script = shared / "tool"
    script.write_text(f"#!{interpreter}\necho hi\n")
    script.chmod(0o755)
    with pytest.raises(PermanentDriverError) as refused:
        check_runnable(["tool", "--flag"], str(shared), NOBODY)
    assert refused.value.code == "not_runnable" and str(private) in str(refused.value)
    check_runnable(["sh", "-c", "true"], "/usr/bin:/bin", NOBODY)  # the system's shell: reachable
    private.chmod(0o711)
    check_runnable(["tool"], str(shared), NOBODY)  # passable now
