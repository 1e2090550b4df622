"""The agent: its reporter loop, provisioning through a real worker, and a separate agent process over Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from inventory import mailbox, services
from inventory.agent.config import AgentConfig, activate
from inventory.agent.probe import probe_node
from inventory.agent.reporter import Reporter, node_gpu_group
from inventory.choices import NodeState
from inventory.drivers import make_probe
from inventory.drivers.simulated import SimulatedProbe
from inventory.models import Gpu, Node, NodeEvent, agent_queue_for
from inventory.tasks import apply_heartbeats, heartbeat_simulated_nodes
from tenants.context import Actor
from tests.conftest import World
from tests.inventory.factories import make_node
from tests.workers import running_worker, wait_until

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_reporter_publishes_every_sample_and_reports_on_schedule_or_fault() -> None:
    probe = make_probe("simulated", node_name="r1", gpu_count=2)
    published: list[tuple[str, int]] = []
    reports: list[dict[str, Any]] = []
    clock = Clock()
    reporter = Reporter(
        node="r1",
        probe=probe,
        send_report=reports.append,
        publish=lambda group, samples: published.append((group, len(samples))),
        heartbeat_seconds=5.0,
        clock=clock,
    )
    assert reporter.tick() is True  # the first tick reports at once
    clock.now = 1.0
    assert reporter.tick() is False
    clock.now = 5.0
    assert reporter.tick() is True
    assert published == [(node_gpu_group("r1"), 2)] * 3
    assert [len(r["samples"]) for r in reports] == [2, 2]
    uuid = probe.inventory().gpus[1].uuid
    probe.inject(uuid, xid=79)  # type: ignore[attr-defined]
    clock.now = 6.0
    assert reporter.tick() is True, "a fault is reported without waiting for the heartbeat"
    assert 79 in reports[-1]["samples"][1]["xid_events"]


def test_reporter_survives_a_broken_transport() -> None:
    def broken(report: dict[str, Any]) -> None:
        raise ConnectionError("redis is down")

    reporter = Reporter(node="r2", probe=make_probe("simulated", node_name="r2", gpu_count=1), send_report=broken)
    assert reporter.tick() is True  # logged, not raised


def _history(report: dict[str, Any]) -> list[float]:
    """Return the timestamps of a one-GPU report's history."""
    (points,) = report["history"].values()
    return [point[0] for point in points]


def test_reporter_sends_every_sample_since_its_last_report_and_flushes_each_new_minute() -> None:
    clock = Clock()
    probe = SimulatedProbe("r3", gpu_count=1, clock=clock)
    reports: list[dict[str, Any]] = []
    reporter = Reporter(node="r3", probe=probe, send_report=reports.append, heartbeat_seconds=5.0, clock=clock)
    sent = []
    for now in (117.5, 118.5, 119.5, 120.5, 121.5, 122.5, 123.5):
        clock.now = now
        sent.append(reporter.tick())
    assert sent == [True, False, False, True, False, True, False]
    assert [_history(report) for report in reports] == [[117.5], [118.5, 119.5, 120.5], [121.5, 122.5]], (
        "the first sample of minute 2 flushes minute 1 without moving the heartbeat's phase (117.5 + 5)"
    )
    (sample,) = reports[1]["samples"]  # the latest reading of each GPU, as before
    fields = ("timestamp", "utilization_gpu", "memory_used_mib", "power_w", "temperature_c")
    assert reports[1]["history"][sample["uuid"]][-1] == [sample[field] for field in fields]
    assert sample["timestamp"] == 120.5 and None not in reports[1]["history"][sample["uuid"]][-1]


def test_reporter_keeps_unsent_history_for_a_bounded_time_and_sends_it_once_it_can() -> None:
    clock = Clock()
    probe = SimulatedProbe("r4", gpu_count=2, clock=clock)
    reports: list[dict[str, Any]] = []
    down = True

    def send(report: dict[str, Any]) -> None:
        if down:
            raise ConnectionError("redis is down")
        reports.append(report)

    reporter = Reporter(node="r4", probe=probe, send_report=send, max_backlog_seconds=10.0, clock=clock)
    for second in range(30):
        clock.now = float(second)
        reporter.tick()
    assert all(len(points) == 11 for points in reporter.history.values()), "the last 10 s, both ends included"
    down = False
    clock.now = 30.0
    assert reporter.tick() is True
    assert [len(points) for points in reports[0]["history"].values()] == [11, 11]
    assert reports[0]["history"][probe.inventory().gpus[1].uuid][0][0] == 20.0
    assert reporter.history == {}, "what got through is not sent again"
    clock.now = 31.0
    reporter.tick()
    clock.now = 35.0
    reporter.tick()
    assert [point[0] for point in reports[-1]["history"][probe.inventory().gpus[0].uuid]] == [31.0, 35.0]


def test_an_agent_refuses_probes_for_another_node(tmp_path: Path) -> None:
    config = AgentConfig(node="mine", work_dir=tmp_path)
    report = probe_node({"node": "theirs", "runtime": "docker", "attempt": 1}, config)
    assert report["error"] == {
        "step": "runtime",
        "code": "wrong_agent",
        "message": "this agent serves mine, not node theirs",
    }


@pytest.fixture
def local_agent(tmp_path: Path) -> Iterator[AgentConfig]:
    """An agent for node `it-local` in this process: simulated GPUs, the process runtime enabled."""
    config = AgentConfig(
        node="it-local", work_dir=tmp_path, process_enabled=True, probe="simulated", simulated_gpu_count=2
    )
    activate(config)
    with running_worker(["control", "ingest", agent_queue_for("it-local")], concurrency=2):
        yield config


def _provision(world: World, name: str, **kwargs: Any) -> Node:
    operator = Actor(user=world.operator)
    node = make_node(operator, world.pool, name=name, state=NodeState.REGISTERED, **kwargs)
    return services.provision_node(actor=operator, node=node)


def _settled(name: str) -> bool:
    return Node.objects.get(name=name).state != NodeState.PROVISIONING


@pytest.mark.django_db(transaction=True)
def test_provisioning_through_the_agent_queue_makes_the_node_ready(world: World, local_agent: AgentConfig) -> None:
    _provision(world, "it-local", runtime="process")
    assert wait_until(lambda: _settled("it-local")), "provisioning never finished"
    node = Node.objects.get(name="it-local")
    assert (node.state, node.state_reason) == (NodeState.READY, "")
    assert node.agent_version and node.probed_at is not None
    assert Gpu.objects.filter(node=node).count() == 2
    assert NodeEvent.objects.filter(node=node, kind="node.probed").exists()


@pytest.mark.django_db(transaction=True)
def test_a_failing_health_check_fails_the_node_with_the_exit_code(
    world: World, local_agent: AgentConfig, settings: Any
) -> None:
    settings.GPUCLOUD_HEALTHCHECK_COMMAND = ["sh", "-c", "echo broken >&2; exit 3"]
    _provision(world, "it-local", runtime="process")
    assert wait_until(lambda: _settled("it-local"))
    node = Node.objects.get(name="it-local")
    assert node.state == NodeState.FAILED
    assert node.state_reason.startswith("health-check container exited with code 3")


@pytest.mark.django_db(transaction=True)
def test_an_agent_without_the_process_runtime_fails_such_a_node(world: World, tmp_path: Path) -> None:
    activate(AgentConfig(node="it-local", work_dir=tmp_path, process_enabled=False, probe="simulated"))
    with running_worker(["control", "ingest", agent_queue_for("it-local")]):
        _provision(world, "it-local", runtime="process")
        assert wait_until(lambda: _settled("it-local"))
    node = Node.objects.get(name="it-local")
    assert node.state == NodeState.FAILED and node.state_reason.startswith("runtime: ")


@pytest.mark.django_db(transaction=True)
def test_simulated_nodes_provision_on_the_controller_and_heartbeat_from_it(world: World) -> None:
    with running_worker(["control"]):
        _provision(world, "sim-1", runtime="simulated", simulated_gpu_count=4)
        assert wait_until(lambda: _settled("sim-1"))
    node = Node.objects.get(name="sim-1")
    assert node.state == NodeState.READY
    assert Gpu.objects.filter(node=node, model="NVIDIA H100 80GB HBM3").count() == 4
    assert heartbeat_simulated_nodes() == 1
    assert Node.objects.get(name="sim-1").last_heartbeat_at is not None
    assert Gpu.objects.filter(node=node, last_sample__isnull=False).count() == 4


@pytest.mark.docker
@pytest.mark.django_db(transaction=True)
def test_provisioning_a_docker_node_runs_the_health_check_container(
    world: World, tmp_path: Path, settings: Any, test_image: str
) -> None:
    settings.GPUCLOUD_HEALTHCHECK_IMAGE = test_image
    settings.GPUCLOUD_HEALTHCHECK_COMMAND = ["true"]
    activate(AgentConfig(node="it-docker", work_dir=tmp_path, pull_images=False))
    with running_worker(["control", "ingest", agent_queue_for("it-docker")]):
        _provision(world, "it-docker", runtime="docker")
        assert wait_until(lambda: _settled("it-docker"), timeout=60)
    node = Node.objects.get(name="it-docker")
    assert (node.state, node.state_reason) == (NodeState.READY, "")
    assert node.engine_version and node.runc_version
    # This host has no GPU: NVML reports none, so no toolkit is required.
    assert not Gpu.objects.filter(node=node).exists()


@pytest.fixture
def agent_process(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`gpucloud agent --node it-remote` as its own process, reporting through Redis."""
    env = {
        **os.environ,
        "GPUCLOUD_DATA_DIR": str(tmp_path),
        "GPU_SAMPLE_SECONDS": "1",
        "NODE_HEARTBEAT_SECONDS": "1",
        "SECRET_KEY": settings.SECRET_KEY,
        "DATABASE_URL": "postgres://nobody:wrong@127.0.0.1:1/none",  # the agent must never need it
    }
    command = [sys.executable, "-c", "from gpucloud.cli import main; main()", "agent", "--node", "it-remote"]
    command += ["--probe", "simulated", "--simulated-gpus", "2", "--allow-process-runtime", "--loglevel", "WARNING"]
    agent = subprocess.Popen(command, cwd=ROOT, env=env)
    yield agent
    if agent.poll() is None:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_a_separate_agent_process_provisions_heartbeats_and_its_loss_is_noticed(
    world: World, agent_process: subprocess.Popen[bytes]
) -> None:
    mailbox.drain_reports(lambda reports: None)
    with running_worker(["control"]):
        _provision(world, "it-remote", runtime="process")
        assert wait_until(lambda: _settled("it-remote"), timeout=60), "the agent process never answered"
    assert Node.objects.get(name="it-remote").state == NodeState.READY
    assert wait_until(lambda: apply_heartbeats() and Gpu.objects.filter(last_sample__isnull=False).count() == 2)
    assert Node.objects.get(name="it-remote").last_heartbeat_at is not None
    agent_process.send_signal(signal.SIGTERM)
    agent_process.wait(timeout=30)
    apply_heartbeats()
    later = timezone.now() + timedelta(seconds=settings.NODE_HEARTBEAT_TIMEOUT_SECONDS + 1)
    assert services.mark_unreachable_nodes(
        timeout=timedelta(seconds=settings.NODE_HEARTBEAT_TIMEOUT_SECONDS), now=later
    ) == ["it-remote"]
    mailbox.post_report({"node": "it-remote", "sent_at": time.time()})
    apply_heartbeats()
    assert Node.objects.get(name="it-remote").state == NodeState.READY
