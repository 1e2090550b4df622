"""Ledger rows written directly, with exact times: what the scheduler and the agents would have left behind."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.models import User

from inventory.models import Gpu, GpuMinute, Node
from jobs.choices import WorkloadState
from jobs.models import Allocation, Workload
from tenants.models import Project
from tests.conftest import World


def workload(world: World, project: Project, owner: User, *, name: str = "train", **fields: Any) -> Workload:
    """A finished workload of `project` in the shared pool (its state does not matter to accounting)."""
    return Workload.all_tenants.create(
        tenant_id=project.tenant_id,
        project=project,
        owner=owner,
        name=name,
        image="registry.example.com/team/train:1.0",
        pool=world.pool,
        state=WorkloadState.SUCCEEDED,
        **fields,
    )


def hold(
    work: Workload, node: Node, gpu: Gpu | None, start: datetime, end: datetime | None, *, replica: int = 0
) -> Allocation:
    """Record that `work` held `gpu` (or, for None, its node's CPU and memory) from `start` to `end`."""
    return Allocation.all_tenants.create(
        tenant_id=work.tenant_id, workload=work, replica=replica, node=node, gpu=gpu, created_at=start, released_at=end
    )


def minute(gpu: Gpu, at: datetime, utilization: float, *, samples: int = 4) -> GpuMinute:
    """Record one rolled-up minute of `gpu` at `utilization` percent."""
    return GpuMinute.objects.create(
        gpu=gpu, minute=at, samples=samples, utilization_sum=utilization * samples, utilization_max=utilization
    )
