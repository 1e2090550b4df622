"""The simulated fleet the Postgres-and-Redis benchmarks start from: one pool of ready nodes with H100 GPUs."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

MODEL = "NVIDIA H100 80GB HBM3"


def fleet(pool_name: str, prefix: str, nodes: int, gpus: int, uuid: Callable[[str, int], str]) -> tuple[Any, Any]:
    """Set Django up, migrate, and (re)create `nodes` ready nodes `<prefix>-00000`, ... in pool `pool_name`,
    each with `gpus` GPUs whose UUIDs `uuid(node name, index)` gives; return (nodes, GPUs) as created.

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
    created = Node.objects.bulk_create(
        Node(name=f"{prefix}-{i:05d}", pool=pool, runtime="docker", state="ready") for i in range(nodes)
    )
    made = Gpu.objects.bulk_create(
        Gpu(node=node, index=g, uuid=uuid(node.name, g), model=MODEL) for node in created for g in range(gpus)
    )
    return created, made
