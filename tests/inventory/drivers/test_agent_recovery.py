"""The agent after an engine outage: once the runtime answers again it asks the controller to reconcile at once.

The engine's socket goes through a door the test opens and closes (a Unix
socket relaying to the real Docker Engine), as a Docker Engine restart
makes it vanish and come back.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from common.protocol.messages import ReplicaSpec, WatchReplica
from inventory.agent.config import AgentConfig
from inventory.agent.executor import OUTPUT_GAP_NOTE, Executor
from inventory.drivers import policy
from tests.inventory.drivers.conftest import TEST_INSTALLATION, agent_spec
from tests.workers import wait_until

pytestmark = pytest.mark.docker

ENGINE = "/var/run/docker.sock"
NODE = "recovery-local"


class EngineDoor:
    """A Unix socket at `path` relaying every connection to the Docker Engine while open; absent while closed.

    Closing it also cuts the connections it relays, as an engine that dies does.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._listener: socket.socket | None = None
        self._relayed: list[socket.socket] = []

    def open(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.path))
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def close(self) -> None:
        if self._listener is not None:
            with suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        for relayed in self._relayed:
            with suppress(OSError):
                relayed.shutdown(socket.SHUT_RDWR)
            relayed.close()
        self._relayed.clear()
        with suppress(FileNotFoundError):
            os.unlink(self.path)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            engine.connect(ENGINE)
            self._relayed += [client, engine]
            threading.Thread(target=_pump, args=(client, engine), daemon=True).start()
            threading.Thread(target=_pump, args=(engine, client), daemon=True).start()


def _pump(source: socket.socket, target: socket.socket) -> None:
    with suppress(OSError):
        while chunk := source.recv(65536):
            target.sendall(chunk)
    with suppress(OSError):
        target.shutdown(socket.SHUT_WR)


@pytest.fixture
def door(tmp_path: Path) -> Iterator[EngineDoor]:
    # A short path: Unix socket paths are limited to about 100 bytes.
    made = EngineDoor(Path(f"/tmp/gpucloud-door-{os.getpid()}.sock"))  # noqa: S108
    yield made
    made.close()


Sent = list[tuple[str, dict[str, Any]]]


def _agent(tmp_path: Path, door: EngineDoor, sent: Sent) -> Executor:
    """An agent whose Docker Engine is behind `door`; its reports go to `sent`."""
    config = AgentConfig(node=NODE, work_dir=tmp_path, docker_url=f"unix://{door.path}", pull_images=False)
    return Executor(config, send=lambda task, **kwargs: sent.append((task, kwargs)))


def _spec(workload: int, tenant: str, image: str, command: list[str]) -> ReplicaSpec:
    return ReplicaSpec.from_wire(agent_spec(NODE, workload, tenant, image, command))


def test_an_agent_asks_for_a_reconcile_once_its_engine_answers_again(
    tmp_path: Path, door: EngineDoor, fresh_tenant: str, test_image: str
) -> None:
    sent: Sent = []
    agent = _agent(tmp_path, door, sent)
    spec = _spec(9, fresh_tenant, test_image, ["true"])
    agent.start(spec)  # the engine is down: nothing is reported, the start waits for reconcile
    assert sent == []
    assert not wait_until(lambda: sent, timeout=2.5), "nothing is asked while the engine stays down"
    door.open()
    assert wait_until(lambda: sent, timeout=10)
    assert wait_until(lambda: not agent.recovering("docker", NODE), timeout=5)
    assert [task for task, _ in sent] == ["jobs.reconcile"]
    agent.start(dataclasses.replace(spec, name=policy.container_name(TEST_INSTALLATION, 9, 1, 1), replica=1))
    assert [task for task, _ in sent][-1] == "jobs.replica_started"
    assert wait_until(lambda: exits(sent), timeout=10)
    assert exits(sent) == [""], "it ended with its engine up: nothing of its output is in doubt"
    assert wait_until(lambda: not agent._watchers and not agent._followers), "ended watchers are forgotten"
    assert [task for task, _ in sent].count("jobs.reconcile") == 1


def exits(sent: Sent) -> list[str]:
    return [kwargs["message"] for task, kwargs in sent if task == "jobs.replica_exited"]


def test_a_replica_that_ended_while_its_engine_was_down_says_its_output_may_be_missing(
    tmp_path: Path, door: EngineDoor, fresh_tenant: str, test_image: str
) -> None:
    sent: Sent = []
    agent = _agent(tmp_path, door, sent)
    spec = _spec(8, fresh_tenant, test_image, ["sh", "-c", "echo before; sleep 1.5; echo after"])
    door.open()
    agent.start(spec)
    handle = next(kwargs["handle"] for task, kwargs in sent if task == "jobs.replica_started")
    assert wait_until(lambda: any(task == "jobs.ingest_log_batches" for task, _ in sent), timeout=10)
    door.close()  # the engine is gone while the replica runs on and exits
    time.sleep(3)
    door.open()
    assert wait_until(lambda: any(task == "jobs.reconcile" for task, _ in sent), timeout=10)
    # The controller's reconcile has the node follow the replica again (`Executor.watch`).
    ref = {"node": spec.node, "runtime": spec.runtime, "name": spec.name, "workload_id": spec.workload_id}
    agent.watch(WatchReplica.from_wire({**ref, "attempt": spec.attempt, "replica": 0, "handle": handle}))
    assert wait_until(lambda: exits(sent), timeout=10)
    assert exits(sent) == [OUTPUT_GAP_NOTE]
