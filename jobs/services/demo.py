"""The demo fleet: simulated GPU nodes, a pool, a tenant with quota and projects, and work queued on them.

For a newcomer without GPUs (`gpucloud up --demo`, `gpucloud demo`, or the
button on the empty cluster page): within a minute the cluster page shows
GPUs the scheduler allocated, the queue shows work waiting with its reasons,
and the charts fill with the simulated load. Nothing of it is real, and it
says so: the nodes use the `simulated` runtime (which the UI and the API
mark as simulated) and carry the label `gpucloud.demo=simulated`; the pool,
the tenant, its projects and its workloads are all named `sim-…`, and the
tenant's and pool's descriptions say what they are. Simulated jobs run for a
minute at 90 % GPU utilization, then succeed.

Idempotent: everything is found by name first, and the demo work is
submitted only while the demo tenant has none, so asking twice adds nothing
twice. It runs the simulated nodes' provisioning probe in this process (the
controller runs it for simulated nodes anyway), so `gpucloud demo` works
beside a running embedded console, whose in-process broker no other process
can reach.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction

from inventory.agent.probe import probe_node
from inventory.choices import NodeState, RuntimeKind
from inventory.models import Node, NodePool
from inventory.services import complete_provisioning, create_node_pool, provision_node, register_node
from inventory.services.local_node import LOCAL_POOL, local_notebook_image
from inventory.services.provisioning import probe_request
from jobs.choices import WorkloadKind
from jobs.models import LaunchPreset, Workload
from jobs.services.images import create_allowed_image, policy_for_tenant
from jobs.services.presets import PresetValues, create_preset
from jobs.services.submission import submit_workloads
from tenants.context import Actor
from tenants.models import Project, ProjectQuota, Tenant, TenantQuota
from tenants.services import QuotaValues, create_project, create_project_quota, create_tenant, create_tenant_quota
from tenants.services.access import require_operator

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
DEMO_POOL = "sim-demo"
DEMO_TENANT = "sim-demo"
DEMO_LABEL = "gpucloud.demo"
DEMO_IMAGE = "sim-demo/trainer:latest"
DEMO_IMAGES = "sim-demo/*"
NODES = (("sim-h100-01", H100), ("sim-h100-02", H100), ("sim-h100-03", H100), ("sim-a100-01", A100))
GPUS_PER_NODE = 8
# 32 GPUs; the tenant may hold 28 of them, each project 20: more work than that waits, with its reason.
TENANT_QUOTA = QuotaValues(guaranteed=16, limit=28, weight=1)
PROJECTS = {
    "sim-vision": ("Vision (simulated)", QuotaValues(guaranteed=8, limit=20, weight=1)),
    "sim-language": ("Language (simulated)", QuotaValues(guaranteed=8, limit=20, weight=1)),
}
# (project, name, GPUs per replica, replicas, GPU models, priority class)
WORK: tuple[tuple[str, str, int, int, tuple[str, ...], str], ...] = (
    ("sim-vision", "sim-train-resnet", 8, 1, (H100,), "normal"),
    ("sim-vision", "sim-train-vit-gang", 8, 2, (H100,), "normal"),
    ("sim-vision", "sim-augment", 2, 1, (), "low"),
    ("sim-language", "sim-finetune-a100", 8, 1, (A100,), "high"),
    *(("sim-language", f"sim-sweep-{i}", 2, 1, (), "normal") for i in range(1, 5)),
    *(("sim-language", f"sim-eval-{i}", 1, 1, (), "low") for i in range(1, 4)),
)
LOCAL_PRESET = "Notebook on this machine (no GPU)"


@dataclass(frozen=True)
class DemoFleet:
    """What `add_demo_fleet` found or added: names, and how many nodes and workloads are new."""

    pool: str
    tenant: str
    nodes: list[str]
    nodes_added: int
    workloads_added: int

    def summary(self) -> str:
        """One sentence for the CLI and the page."""
        if not self.nodes_added and not self.workloads_added:
            return f"The simulated demo fleet is already here: {len(self.nodes)} nodes in pool {self.pool}."
        return (
            f"Simulated demo fleet added: {self.nodes_added} nodes of {GPUS_PER_NODE} GPUs in pool {self.pool}, "
            f"tenant {self.tenant} with {self.workloads_added} jobs queued."
        )


def add_demo_fleet(*, actor: Actor) -> DemoFleet:
    """Add the simulated demo fleet, or whatever of it is missing, and return what is there; operators only.

    Raises PermissionDenied for anyone else. Nodes become ready before this
    returns; the jobs are pending until the next scheduling pass.
    """
    require_operator(actor)
    pool = _pool(actor)
    added = sum(_node(actor, pool, name, model) for name, model in NODES)
    tenant, projects = _tenancy(actor, pool)
    workloads = _work(actor, pool, tenant, projects)
    _local_notebook(actor, tenant, projects["sim-vision"])
    names = [name for name, _ in NODES]
    return DemoFleet(pool.name, tenant.slug, names, nodes_added=added, workloads_added=workloads)


def _pool(actor: Actor) -> NodePool:
    existing = NodePool.objects.filter(name=DEMO_POOL).first()
    if existing is not None:
        return existing
    description = "Simulated demo fleet: these nodes and GPUs exist only in the database (gpucloud demo)."
    return create_node_pool(actor=actor, name=DEMO_POOL, description=description)


def _node(actor: Actor, pool: NodePool, name: str, model: str) -> bool:
    """Register and provision simulated node `name` unless it exists; return whether it is new."""
    node = Node.objects.filter(name=name).first()
    new = node is None
    if node is None:
        node = register_node(
            actor=actor,
            name=name,
            pool=pool,
            runtime=RuntimeKind.SIMULATED,
            labels={DEMO_LABEL: "simulated"},
            simulated_gpu_count=GPUS_PER_NODE,
            simulated_gpu_model=model,
        )
    if node.is_simulated and node.state in (NodeState.REGISTERED, NodeState.FAILED):
        _provision_here(actor, node)
    return new


def _provision_here(actor: Actor, node: Node) -> None:
    """Provision a simulated node with its probe run in this process, as the controller would run it."""
    node = provision_node(actor=actor, node=node)
    report = probe_node(probe_request(node), None)
    complete_provisioning(node_id=node.pk, attempt=node.provisioning_attempt, report=report)


@transaction.atomic
def _tenancy(actor: Actor, pool: NodePool) -> tuple[Tenant, dict[str, Project]]:
    tenant = Tenant.objects.filter(slug=DEMO_TENANT).first() or create_tenant(
        actor=actor,
        slug=DEMO_TENANT,
        name="Demo (simulated)",
        description="A demo tenant on simulated GPUs: its jobs only pretend to run (gpucloud demo).",
    )
    if not TenantQuota.all_tenants.filter(tenant=tenant, pool=pool).exists():
        create_tenant_quota(actor=actor, tenant=tenant, pool=pool, values=TENANT_QUOTA)
    projects: dict[str, Project] = {}
    for slug, (name, values) in PROJECTS.items():
        project = Project.all_tenants.filter(tenant=tenant, slug=slug).first() or create_project(
            actor=actor, tenant=tenant, slug=slug, name=name
        )
        if not ProjectQuota.all_tenants.filter(project=project, pool=pool).exists():
            create_project_quota(actor=actor, project=project, pool=pool, values=values)
        projects[slug] = project
    if policy_for_tenant(tenant.pk).enforced and not policy_for_tenant(tenant.pk).allows(DEMO_IMAGE, notebook=False):
        # The allow-list is on (an operator added patterns): the demo's made-up images need a pattern of their own.
        create_allowed_image(actor=actor, pattern=DEMO_IMAGES, tenant=tenant, description="Simulated demo jobs")
    return tenant, projects


@transaction.atomic
def _work(actor: Actor, pool: NodePool, tenant: Tenant, projects: dict[str, Project]) -> int:
    """Queue the demo jobs unless the demo tenant already has work; return how many were queued."""
    if Workload.all_tenants.filter(tenant=tenant).exists():
        return 0
    count = 0
    for slug, project in projects.items():
        items = [_job(pool, *entry[1:]) for entry in WORK if entry[0] == slug]
        count += len(submit_workloads(actor=actor, project=project, items=items))
    return count


def _job(pool: NodePool, name: str, gpus: int, replicas: int, models: tuple[str, ...], priority: str) -> dict[str, Any]:
    return {
        "name": name,
        "image": DEMO_IMAGE,
        "pool": pool,
        "kind": WorkloadKind.JOB,
        "command": ["python", "train.py", "--simulated"],
        "gpus_per_replica": gpus,
        "replicas": replicas,
        "gpu_models": list(models),
        "priority_class": priority,
    }


@transaction.atomic
def _local_notebook(actor: Actor, tenant: Tenant, project: Project) -> None:
    """When this machine is a node (pool `local`), let the demo tenant launch a real notebook there from a preset."""
    pool = NodePool.objects.filter(name=LOCAL_POOL).first()
    image = local_notebook_image()
    if pool is None or image is None or LaunchPreset.all_tenants.filter(tenant=tenant, name=LOCAL_PRESET).exists():
        return
    if not policy_for_tenant(tenant.pk).allows(image, notebook=True):
        return  # an operator's allow-list decides which notebook images run; the demo does not widen it
    if not TenantQuota.all_tenants.filter(tenant=tenant, pool=pool).exists():
        create_tenant_quota(actor=actor, tenant=tenant, pool=pool, values=QuotaValues())
    if not ProjectQuota.all_tenants.filter(project=project, pool=pool).exists():
        create_project_quota(actor=actor, project=project, pool=pool, values=QuotaValues())
    values = PresetValues(
        name=LOCAL_PRESET,
        image=image,
        pool=pool,
        description="A real JupyterLab on the console's own machine, without a GPU.",
        gpus_per_replica=0,
    )
    create_preset(actor=actor, tenant=tenant, values=values)
