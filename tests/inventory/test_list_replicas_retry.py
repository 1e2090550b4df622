"""An inventory question the node's runtime cannot answer now (its engine restarting) is answered once it can.

The controller keeps one question per node open until its answer comes
(jobs.services.reconcile._ask); a question dropped on an engine outage left
the node unreconciled for minutes, and the docker-restart fault lost its work.
The runtime's outage is injected: what is tested is the task's retry.
"""

from __future__ import annotations

from typing import Any

import pytest

from common.protocol.messages import NodeReplicas
from inventory.agent import tasks
from inventory.drivers.base import TransientDriverError


class Runtime:
    """An agent whose runtime fails its first `failures` listings, then answers."""

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0
        self.reports: list[Any] = []

    def inventory_report(self, **asked: Any) -> dict[str, Any]:
        self.calls += 1
        if self.calls <= self.failures:
            raise TransientDriverError("list containers: engine unreachable")
        return {"node": asked["node"], "managed": [], "starting": [], "gone": [], "unstarted": []}

    def report(self, message: Any) -> None:
        self.reports.append(message)


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Any:
    def install(failures: int) -> Runtime:
        agent = Runtime(failures)
        monkeypatch.setattr(tasks, "executor", lambda: agent)
        monkeypatch.setattr(tasks, "keep_egress", lambda config: False)
        return agent

    return install


def test_a_question_asked_while_the_engine_is_down_is_answered_once_it_is_back(runtime: Any) -> None:
    agent = runtime(failures=3)

    # Not .get(): an in-process Celery worker an earlier test ran leaves Celery's "inside a task" flag set.
    result = tasks.list_replicas.apply(kwargs={"node": "gpu-1", "runtime": "docker"})

    assert result.successful(), result.result
    assert agent.calls == 4
    assert agent.reports == [NodeReplicas(node="gpu-1", managed=[], starting=[], gone=[], unstarted=[])]


def test_a_runtime_that_never_comes_back_ends_the_retries_with_its_error(runtime: Any) -> None:
    agent = runtime(failures=10_000)

    result = tasks.list_replicas.apply(kwargs={"node": "gpu-1", "runtime": "docker"})

    assert isinstance(result.result, TransientDriverError)
    assert agent.calls == tasks.LIST_RETRIES + 1
    assert agent.reports == []
