"""Submission-ready worlds: project quotas, nodes with GPUs, assigned members, workload requests."""

from __future__ import annotations

import time
from typing import Any

from django.contrib.auth.models import User

from inventory.models import Gpu, Node
from jobs.choices import WorkloadState
from jobs.models import Replica, Workload
from jobs.scheduler.shell import run_pass
from tenants.context import Actor
from tenants.models import Membership, Project, ProjectQuota
from tests.conftest import World
from tests.inventory.factories import make_node

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-40GB"


def give_quota(world: World, project: Project | None = None, *, limit: int = 8, **fields: Any) -> ProjectQuota:
    """Give `project` (alpha by default) a quota in the shared pool."""
    project = project or world.project_a
    return ProjectQuota.all_tenants.create(
        tenant_id=project.tenant_id, project=project, pool=world.pool, limit=limit, **fields
    )


def add_node(world: World, name: str = "n1", *, gpus: int = 8, model: str = H100) -> Node:
    """Register a ready simulated node in the shared pool with `gpus` GPUs of `model`."""
    node = make_node(Actor(user=world.operator), world.pool, name=name, gpus=0)
    Gpu.objects.bulk_create(Gpu(node=node, index=i, uuid=f"GPU-{name}-{i}", model=model) for i in range(gpus))
    return node


def add_replica(world: World, node: Node, *, state: str = WorkloadState.RUNNING, name: str = "job") -> Replica:
    """Return replica 0 of attempt 1 of a new workload of alpha in `state`, placed on `node` (launching)."""
    workload = Workload.all_tenants.create(
        tenant_id=world.project_a.tenant_id,
        project=world.project_a,
        owner=world.member_a,
        name=name,
        image="local",
        pool=world.pool,
        state=state,
        attempt=1,
    )
    return Replica.all_tenants.create(
        tenant_id=workload.tenant_id, workload=workload, attempt=1, index=0, node=node, name=f"{name}-w{workload.pk}"
    )


def assign(user: User, project: Project) -> None:
    """Put `user` (already a member of the project's tenant) on `project`."""
    Membership.all_tenants.get(user=user, tenant_id=project.tenant_id).projects.add(project)


def ready_world(world: World) -> World:
    """Alpha has an 8-GPU quota in `shared`, one ready 8-GPU node there, and member_a works in alpha."""
    give_quota(world)
    add_node(world)
    assign(world.member_a, world.project_a)
    return world


def request(world: World, **overrides: Any) -> dict[str, Any]:
    """Return the service input of a 1-GPU batch job in the shared pool."""
    return {"name": "train", "image": "registry.example.com/team/train:1.0", "pool": world.pool, **overrides}


def run_pass_now() -> None:
    """Run a scheduling pass in this thread, waiting while one that a submission triggered holds the lock.

    With a worker running, each submission asks for a pass on commit; the
    request coalesces into one already waiting, so the worker's pass may have read the ledger
    before the last submission committed. A pass run here afterwards
    always sees it.
    """
    deadline = time.monotonic() + 30
    while run_pass() is None:
        assert time.monotonic() < deadline, "the scheduler lock stayed held for 30 s"
        time.sleep(0.02)
