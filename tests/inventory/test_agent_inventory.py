"""The agent's own view for reconcile (`Executor.inventory_report`), on the real process runtime.

Only the node may say a replica is gone: a replica the controller heard
started and that the runtime no longer has. One it is still starting is
`starting`, never gone; one it never heard of is not its to judge.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

from common.protocol.messages import Reconcile, ReplicaSpec, ReplicaStarted
from inventory.agent.config import AgentConfig
from inventory.agent.executor import Executor
from inventory.drivers import policy
from tests.inventory.drivers.conftest import TEST_INSTALLATION
from tests.process_user import workload_python
from tests.workers import wait_until

NODE = "inv-local"


def _spec(name: str, *, seconds: float) -> ReplicaSpec:
    return ReplicaSpec.from_wire(
        {
            "node": NODE,
            "runtime": "process",
            "name": name,
            "workload_id": 7,
            "tenant": "alpha",
            "attempt": 1,
            "replica": int(name.split("-r")[1].split("-")[0]),
            "image": "local",
            "command": [*workload_python(), "-c", f"import time; print('up', flush=True); time.sleep({seconds})"],
            "env": {},
        }
    )


def _executor(tmp_path: Path, sent: list[tuple[str, dict[str, Any]]]) -> Executor:
    config = AgentConfig(node=NODE, work_dir=tmp_path, process_enabled=True, probe="simulated")
    return Executor(config, send=lambda task, **kwargs: sent.append((task, kwargs)))


def test_gone_names_only_confirmed_replicas_the_runtime_no_longer_has(tmp_path: Path) -> None:
    sent: list[tuple[str, dict[str, Any]]] = []
    agent = _executor(tmp_path, sent)
    alive, vanished = (
        policy.container_name(TEST_INSTALLATION, 7, 0, 1),
        policy.container_name(TEST_INSTALLATION, 7, 1, 1),
    )
    agent.start(_spec(alive, seconds=30))
    agent.start(_spec(vanished, seconds=30))
    assert [task for task, _ in sent].count(ReplicaStarted.TASK) == 2
    runtime = agent.runtime("process", NODE)
    handle = next(m.handle for m in runtime.list_managed() if m.name == vanished)
    runtime.stop(handle, grace_seconds=0)
    shutil.rmtree(tmp_path / vanished)  # removed behind the agent's back
    never_heard = policy.container_name(TEST_INSTALLATION, 7, 2, 1)
    report = agent.inventory_report(node=NODE, runtime="process", confirmed=[alive, vanished])
    assert report["gone"] == [vanished]
    assert [item["name"] for item in report["managed"]] == [alive]
    assert never_heard not in report["gone"], "a replica the controller never confirmed is not the agent's to judge"
    runtime.stop(next(m.handle for m in runtime.list_managed() if m.name == alive), grace_seconds=0)


def test_a_replica_being_started_is_starting_not_gone(tmp_path: Path, monkeypatch: Any) -> None:
    sent: list[tuple[str, dict[str, Any]]] = []
    agent = _executor(tmp_path, sent)
    name = policy.container_name(TEST_INSTALLATION, 7, 0, 1)
    runtime = agent.runtime("process", NODE)
    release = threading.Event()
    real_start = runtime.start

    def slow_start(spec: Any, **kwargs: Any) -> Any:
        release.wait(10)  # a busy host: the start takes a while
        return real_start(spec, **kwargs)

    monkeypatch.setattr(runtime, "start", slow_start)
    starter = threading.Thread(target=agent.start, args=(_spec(name, seconds=30),))
    starter.start()
    assert wait_until(lambda: name in agent._starting, timeout=5)
    agent.start(_spec(name, seconds=30))  # a re-sent start while the first is under way: a no-op
    report = agent.inventory_report(node=NODE, runtime="process", confirmed=[name])
    assert report["starting"] == [name] and report["gone"] == []
    assert "unstarted" not in report, "a controller that names no launches gets the answer it knows"
    lost = policy.container_name(TEST_INSTALLATION, 8, 0, 1)  # launched before the question, its start never arrived
    report = agent.inventory_report(node=NODE, runtime="process", confirmed=[], launched=[name, lost])
    assert report["unstarted"] == [lost], "the one being started is not sent again"
    release.set()
    starter.join(10)
    assert [task for task, _ in sent].count(ReplicaStarted.TASK) == 1
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not runtime.list_managed():
        time.sleep(0.05)
    runtime.stop(next(m.handle for m in runtime.list_managed() if m.name == name), grace_seconds=0)


def test_a_start_that_times_out_is_adopted_or_left_to_reconcile_never_reported_failed(
    tmp_path: Path, monkeypatch: Any
) -> None:
    from inventory.drivers.base import DriverTimeout

    sent: list[tuple[str, dict[str, Any]]] = []
    agent = _executor(tmp_path, sent)
    runtime = agent.runtime("process", NODE)
    real_start = runtime.start

    def started_but_late(spec: Any, **kwargs: Any) -> Any:
        real_start(spec, **kwargs)
        raise DriverTimeout("the supervisor answered after the timeout")

    def never(spec: Any, **kwargs: Any) -> Any:
        raise DriverTimeout("nothing answered")

    monkeypatch.setattr(runtime, "start", never)
    agent.start(_spec(policy.container_name(TEST_INSTALLATION, 7, 0, 1), seconds=30))
    # A slow start is not a failed one: once the runtime answers, reconcile is asked for and sends it again.
    assert wait_until(lambda: sent, timeout=5)
    assert [task for task, _ in sent] == [Reconcile.TASK]
    monkeypatch.setattr(runtime, "start", started_but_late)
    agent.start(_spec(policy.container_name(TEST_INSTALLATION, 7, 1, 1), seconds=30))
    assert [task for task, _ in sent if task != Reconcile.TASK] == [ReplicaStarted.TASK]
    assert not any(kwargs.get("launch_failed") for _, kwargs in sent)
    runtime.stop(
        next(m.handle for m in runtime.list_managed() if m.name == policy.container_name(TEST_INSTALLATION, 7, 1, 1)),
        grace_seconds=0,
    )
