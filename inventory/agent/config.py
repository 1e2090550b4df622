"""How an agent is set up: which node it serves and what it may do there."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.conf import settings


@dataclass(frozen=True)
class AgentConfig:
    """One agent's settings; `probe` is `nvml` for real hosts, `simulated` for demos and scale tests.

    `publish_address` is the IP address the Docker runtime publishes
    workloads' service ports on: one the console's proxy can reach.
    `checkpoint_seconds`: how often running jobs' checkpoint directories are looked at.
    `egress_rules`: whether the agent installs and keeps the egress rules of
    workload bridges (`inventory.drivers.egress`), with `egress_allowed`
    (`CIDR:PORT`) let through; off for agents built in tests, on for every
    agent the environment describes unless GPUCLOUD_AGENT_EGRESS is off.
    """

    node: str
    work_dir: Path
    process_enabled: bool = False
    docker_url: str | None = None
    pull_images: bool = True
    publish_address: str = "127.0.0.1"
    probe: str = "nvml"
    simulated_gpu_count: int = 8
    simulated_gpu_model: str = "NVIDIA H100 80GB HBM3"
    sample_seconds: float = 1.0
    heartbeat_seconds: float = 5.0
    checkpoint_seconds: float = 15.0
    egress_rules: bool = False
    egress_allowed: tuple[str, ...] = ()


def config_from_settings(node: str | None = None, **overrides: object) -> AgentConfig:
    """Return the agent configuration the environment describes, for `node` (default GPUCLOUD_NODE_NAME)."""
    name = node or settings.GPUCLOUD_NODE_NAME
    values: dict[str, object] = {
        "node": name,
        "work_dir": settings.DATA_DIR / "agent" / name,
        "process_enabled": settings.GPUCLOUD_AGENT_PROCESS_RUNTIME,
        "docker_url": settings.DOCKER_HOST,
        "pull_images": settings.GPUCLOUD_AGENT_PULL_IMAGES,
        "publish_address": settings.GPUCLOUD_AGENT_PUBLISH_ADDRESS,
        "sample_seconds": float(settings.GPU_SAMPLE_SECONDS),
        "heartbeat_seconds": float(settings.NODE_HEARTBEAT_SECONDS),
        "checkpoint_seconds": float(settings.CHECKPOINT_SCAN_SECONDS),
        "egress_rules": settings.GPUCLOUD_AGENT_EGRESS,
        "egress_allowed": tuple(settings.GPUCLOUD_EGRESS_ALLOWED),
    }
    values.update(overrides)
    return AgentConfig(**values)  # type: ignore[arg-type]  # keys checked by the dataclass itself


_active: AgentConfig | None = None


def activate(config: AgentConfig) -> None:
    """Make `config` the configuration the agent tasks in this process use."""
    global _active
    _active = config


def active_config() -> AgentConfig | None:
    """Return the configuration of the agent running in this process, if any."""
    return _active
