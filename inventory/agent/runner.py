"""Starting an agent: `gpucloud agent --node NAME`, or inside the console in embedded mode."""

from __future__ import annotations

import threading

from inventory.agent.config import AgentConfig, activate
from inventory.agent.egress import keep_egress
from inventory.agent.probe import simulated_probe
from inventory.agent.reporter import Reporter
from inventory.agent.transport import publish_samples, send_report_to_controller
from inventory.drivers import make_probe
from inventory.drivers.base import GpuProbe
from inventory.models import agent_queue_for


def probe_for(config: AgentConfig) -> GpuProbe:
    """Return the GPU probe `config` asks for: NVML on real hosts, or a simulated one."""
    if config.probe == "simulated":
        return simulated_probe(config.node, gpu_count=config.simulated_gpu_count, model=config.simulated_gpu_model)
    return make_probe(config.probe, node_name=config.node)


def start_reporter(config: AgentConfig) -> tuple[Reporter, threading.Thread]:
    """Activate `config` for this process's agent tasks, install its egress rules, and start the sampler and
    heartbeat thread."""
    activate(config)
    keep_egress(config)
    reporter = Reporter(
        node=config.node,
        probe=probe_for(config),
        send_report=send_report_to_controller,
        publish=publish_samples,
        sample_seconds=config.sample_seconds,
        heartbeat_seconds=config.heartbeat_seconds,
    )
    return reporter, reporter.start_thread()


# The agent's tasks mostly wait on the runtime (a start may take minutes, a stop its grace period): enough
# threads that a reconcile's inventory request never waits behind them.
AGENT_THREADS = 16


def worker_argv(config: AgentConfig, *, loglevel: str = "INFO") -> list[str]:
    """Return the Celery worker arguments of an agent: its own queue only, threads (it mostly waits on I/O)."""
    return [
        "worker",
        "--queues",
        agent_queue_for(config.node),
        "--hostname",
        f"agent@{config.node}",
        "--pool",
        "threads",
        "--concurrency",
        str(AGENT_THREADS),
        "--without-gossip",
        "--without-mingle",
        "--loglevel",
        loglevel,
    ]
