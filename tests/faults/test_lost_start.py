"""A start the Docker Engine lost: containerd ran the container, the engine died before it recorded the start.

The crash window is milliseconds wide (between containerd starting the task
and the engine writing the container's state), so it is made exactly: the
engine of the suite's own (bench/_faults/services.py) runs a container, is
SIGKILLed, its on-disk state of the container is put back to "never
started", and it is started again. That is what a real crash in the window
leaves: the engine lists the container as created while containerd still
runs it (or has its ended task), and its output still reaches the log.

Before the fix, the runtime started such a container a second time (the
job ran twice, Docker 20.10 stored the second run's lines twice) or removed
it and made a fresh one beside it, leaving the first run's process running
with no container to show for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _faults.procs import wait_until
from _faults.services import PrivateDocker

from common.protocol.messages import LogBatches, ReplicaExited, ReplicaSpec
from inventory.agent.config import AgentConfig
from inventory.agent.executor import Executor, driver_spec
from inventory.drivers.base import Handle, WorkloadSpec
from inventory.drivers.docker import LOST_RUN_NOTE, DockerRuntime
from inventory.drivers.docker._engine import container_cgroups
from tests.conftest import ROOT, TEST_IMAGE, docker_cli
from tests.inventory.drivers.conftest import agent_spec, new_spec

# Starts a Docker Engine of its own, so it needs root as dockerd does; without root it fails, never skips.
pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateDocker]:
    run_dir = tmp_path_factory.mktemp("lost-start")
    private = PrivateDocker(run_dir, root=Path(f"/tmp/lost-start-docker-{os.getpid()}"))  # noqa: S108
    private.start()
    try:
        private.build_image(ROOT / ".ci" / "build-test-image", TEST_IMAGE)
        yield private
    finally:
        private.stop()


def _spec(command: str) -> WorkloadSpec:
    return new_spec(["sh", "-c", command], tenant="lost-start", image=TEST_IMAGE)


def _kill(engine: PrivateDocker) -> None:
    """SIGKILL the engine and wait for its containerd to follow it (a new engine cannot start beside it)."""
    engine.kill9()
    config = str(engine.root / "exec" / "containerd" / "containerd.toml").encode()

    def containerd_gone() -> bool:
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and config in (entry / "cmdline").read_bytes():
                    return False
            except OSError:
                continue
        return True

    assert wait_until(containerd_gone, 30)
    (engine.root / "docker.pid").unlink(missing_ok=True)
    (engine.root / "exec" / "containerd" / "containerd.pid").unlink(missing_ok=True)


def _lose_start(engine: PrivateDocker, handle: Handle) -> None:
    """Kill the engine and make its record of the container say it never started, then start it again."""
    _kill(engine)
    state_file = engine.root / "data" / "containers" / str(handle["id"]) / "config.v2.json"
    config = json.loads(state_file.read_text())
    config["State"].update(
        Running=False, Pid=0, ExitCode=0, StartedAt="0001-01-01T00:00:00Z", FinishedAt="0001-01-01T00:00:00Z"
    )
    state_file.write_text(json.dumps(config))
    engine.start()


def _processes(container: str) -> set[int]:
    pids: set[int] = set()
    for group in container_cgroups(container):
        pids |= {int(pid) for pid in (group / "cgroup.procs").read_text().split()}
    return pids


def _lines(runtime: DockerRuntime, handle: Handle) -> list[str]:
    return [line.text for line in runtime.logs(handle, timeout=30)]


def _printed(runtime: DockerRuntime, handle: Handle, count: int) -> bool:
    return len(_lines(runtime, handle)) >= count


def test_a_lost_run_that_still_runs_is_ended_and_reported_not_started_again(engine: PrivateDocker) -> None:
    runtime = DockerRuntime(engine.url)
    spec = _spec("for i in 1 2 3; do echo line $i; done; sleep 300; echo second")
    handle = runtime.start(spec, timeout=60)
    assert wait_until(lambda: _printed(runtime, handle, 3), 30)
    assert _processes(str(handle["id"])), "the run is live before the engine dies"
    _lose_start(engine, handle)
    assert runtime.poll(handle, timeout=30).state == "exited", "created with output: a lost run, not a fresh one"

    again = runtime.start(spec, timeout=60)  # what reconcile sends for a replica still launching

    assert again["id"] == handle["id"], "the lost run is adopted, no second container is made"
    assert not _processes(str(handle["id"])), "its process is ended, not left running without a container"
    status = runtime.poll(again, timeout=30)
    assert (status.state, status.exit_code, status.unobserved) == ("exited", None, True)
    assert status.message == LOST_RUN_NOTE
    time.sleep(2)
    assert _lines(runtime, again) == ["line 1", "line 2", "line 3"], "its output is kept once; it never ran again"
    assert [line.text for line in runtime.logs(again, follow=True, timeout=30)] == ["line 1", "line 2", "line 3"]
    runtime.remove(again, timeout=30)


def test_a_lost_run_that_ended_while_the_engine_was_down_is_reported_not_run_again(engine: PrivateDocker) -> None:
    runtime = DockerRuntime(engine.url)
    spec = _spec("echo only; sleep 2; echo once; exit 0")
    handle = runtime.start(spec, timeout=60)
    assert wait_until(lambda: _printed(runtime, handle, 1), 30)
    _kill(engine)
    assert wait_until(lambda: not _processes(str(handle["id"])), 30), "it ends while the engine is down"
    engine.start()  # the killed engine recorded the run; forget it as a crash in the window would have
    _lose_start(engine, handle)

    again = runtime.start(spec, timeout=60)

    assert again["id"] == handle["id"]
    time.sleep(3)
    assert not _processes(str(handle["id"])), "not started a second time"
    assert runtime.poll(again, timeout=30).unobserved
    # What a container prints after the engine died and before it exits never reaches the log (Docker's own
    # loss, see bench/_faults): "once" may be missing, but nothing is there twice.
    assert _lines(runtime, again) in (["only"], ["only", "once"])
    runtime.remove(again, timeout=30)


def test_a_silent_lost_run_is_ended_and_the_replica_started_afresh(engine: PrivateDocker) -> None:
    runtime = DockerRuntime(engine.url)
    spec = _spec("sleep 300; echo late")
    handle = runtime.start(spec, timeout=60)
    first = _processes(str(handle["id"]))
    assert first
    _lose_start(engine, handle)

    again = runtime.start(spec, timeout=60)

    assert again["id"] != handle["id"], "a fresh container: Docker 20.10 doubles the lines of a restarted stale task"
    assert not first & set().union(*(_processes(str(c)) for c in (handle["id"], again["id"])))
    assert runtime.poll(again, timeout=30).state == "running"
    runtime.remove(again, timeout=30)


def test_removing_a_lost_run_ends_its_process(engine: PrivateDocker) -> None:
    runtime = DockerRuntime(engine.url)
    handle = runtime.start(_spec("echo up; sleep 300"), timeout=60)
    assert wait_until(lambda: _printed(runtime, handle, 1), 30)
    pids = _processes(str(handle["id"]))
    _lose_start(engine, handle)

    runtime.remove(handle, timeout=30)

    assert runtime.poll(handle, timeout=30).state == "missing"
    assert wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids), 10), "no orphaned process"


def test_an_agent_reports_a_lost_run_with_its_output_as_unobserved(engine: PrivateDocker, tmp_path: Path) -> None:
    sent: list[tuple[str, dict[str, Any]]] = []
    config = AgentConfig(node="lost-start", work_dir=tmp_path, docker_url=engine.url, pull_images=False)
    spec = ReplicaSpec.from_wire(
        agent_spec("lost-start", 4242, "lost-start", TEST_IMAGE, ["sh", "-c", "echo a; echo b; sleep 300"])
    )
    runtime = DockerRuntime(engine.url)
    handle = runtime.start(driver_spec(spec), timeout=60)  # the start whose report the engine's crash lost
    assert wait_until(lambda: _printed(runtime, handle, 2), 30)
    _lose_start(engine, handle)

    agent = Executor(config, send=lambda task, **kwargs: sent.append((task, kwargs)))
    agent.start(spec)  # reconcile's start again, on an agent that never saw the first

    def exited() -> list[dict[str, Any]]:
        return [kwargs for task, kwargs in sent if task == ReplicaExited.TASK]

    assert wait_until(exited, 30)
    (report,) = exited()
    assert (report["exit_code"], report["unobserved"], report["message"]) == (None, True, LOST_RUN_NOTE)
    batches = [batch for task, kwargs in sent if task == LogBatches.TASK for batch in kwargs["batches"]]
    shipped = [text for batch in batches for _, _, text in batch["lines"]]
    assert shipped == ["a", "b"], "its output is shipped once, before the exit"
    assert not _processes(str(handle["id"]))
    runtime.remove(handle, timeout=30)


def _shared_bridge() -> str:
    """Return the kernel interface of the shared engine's default `bridge` network (docker0 unless configured)."""
    shown = subprocess.run(
        [docker_cli(), "network", "inspect", "bridge"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    return str(json.loads(shown)[0]["Options"].get("com.docker.network.bridge.name", "docker0"))


def test_the_private_engine_leaves_the_shared_engines_bridge_alone(engine: PrivateDocker, test_image: str) -> None:
    # Runs after the tests above have killed and restarted the engine several times. An engine started with
    # `--bridge none` deletes docker0 on its way up: every later build on the shared engine then failed.
    bridge = _shared_bridge()
    assert Path(f"/sys/class/net/{bridge}").exists(), f"the shared engine's bridge {bridge} is still there"
    assert Path(f"/sys/class/net/{engine.bridge}").exists(), "the private engine has a bridge of its own"
    engine.stop()
    engine.start()
    assert Path(f"/sys/class/net/{bridge}").exists()
    built = subprocess.run(
        [docker_cli(), "run", "--rm", "--pull", "never", test_image, "true"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, f"the shared engine still starts containers on its bridge: {built.stderr}"
