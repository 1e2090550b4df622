"""The simulated fleet the Postgres-and-Redis benchmarks start from: one pool of ready nodes with H100 GPUs."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

MODEL = "NVIDIA H100 80GB HBM3"
GPU_MEMORY_MB = 81559  # what the simulated probe reports for an H100


def fleet(
    pool_name: str, prefix: str, nodes: int, gpus: int, uuid: Callable[[str, int], str], *, simulated: bool = False
) -> tuple[Any, Any]:
    """Set Django up, migrate, and (re)create `nodes` ready nodes `<prefix>-00000`, ... in pool `pool_name`,
    each with `gpus` GPUs whose UUIDs `uuid(node name, index)` gives; return (nodes, GPUs) as created.

    The nodes are docker nodes (their reports come from the bench) unless `simulated`: then they are
    simulated nodes as provisioning leaves them (the simulated runtime's CPUs and memory, the probe's GPU
    count, model and memory, a first heartbeat now), whose work and heartbeats the controller runs; pass
    `inventory.drivers.simulated.simulated_uuid` as `uuid` so the probe's samples match them.

    Exits unless DATABASE_URL is a (scratch) Postgres database and REDIS_URL is set: the benchmarks using
    it measure both.
    """
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from inventory.models import Gpu, Node, NodePool

    if connection.vendor != "postgresql" or not os.environ.get("REDIS_URL"):
        raise SystemExit("Set DATABASE_URL to a scratch Postgres database and REDIS_URL: this measures both.")
    call_command("migrate", verbosity=0)
    pool, _ = NodePool.objects.get_or_create(name=pool_name)
    Node.objects.filter(pool=pool).delete()
    extra = _simulated_fields(gpus) if simulated else {}
    runtime = "simulated" if simulated else "docker"
    created = Node.objects.bulk_create(
        Node(name=f"{prefix}-{i:05d}", pool=pool, runtime=runtime, state="ready", **extra) for i in range(nodes)
    )
    memory = GPU_MEMORY_MB if simulated else 0
    made = Gpu.objects.bulk_create(
        Gpu(node=node, index=g, uuid=uuid(node.name, g), model=MODEL, memory_mib=memory)
        for node in created
        for g in range(gpus)
    )
    return created, made


def _simulated_fields(gpus: int) -> dict[str, Any]:
    from django.utils import timezone

    from inventory.drivers.simulated import SimulatedRuntime

    info = SimulatedRuntime("bench").info()
    return {
        "simulated_gpu_count": gpus,
        "simulated_gpu_model": MODEL,
        "cpu_cores": info.cpu_cores,
        "memory_mib": info.memory_mib,
        "nvidia_runtime": True,
        "device_requests": True,
        "last_heartbeat_at": timezone.now(),
    }
