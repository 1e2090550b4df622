"""The demo fleet (`gpucloud demo`, `gpucloud up --demo`, the cluster page's button): what it adds, once."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied

from inventory.choices import NodeState, RuntimeKind
from inventory.models import Gpu, Node, NodePool
from inventory.services.local_node import register_local_node
from jobs.choices import WorkloadState
from jobs.models import AllowedImage, LaunchPreset, Workload
from jobs.scheduler import shell
from jobs.services.demo import DEMO_IMAGES, DEMO_LABEL, DEMO_POOL, DEMO_TENANT, LOCAL_PRESET, WORK, add_demo_fleet
from tenants.context import Actor
from tenants.models import Project, Tenant, TenantQuota
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator() -> Actor:
    """The first operator, alone in an empty database, as `gpucloud up` creates it."""
    return Actor(user=User.objects.create_user("admin", "", PASSWORD, is_staff=True, is_superuser=True))


def test_the_demo_fleet_is_simulated_ready_and_queued(operator: Actor) -> None:
    fleet = add_demo_fleet(actor=operator)

    nodes = Node.objects.filter(pool__name=DEMO_POOL)
    assert fleet.nodes_added == 4 and nodes.count() == 4
    for node in nodes:
        assert node.name.startswith("sim-") and node.is_simulated and node.labels == {DEMO_LABEL: "simulated"}
        assert node.state == NodeState.READY, (node.name, node.state, node.state_reason)
    assert Gpu.objects.filter(node__pool__name=DEMO_POOL, present=True).count() == 32
    assert set(Gpu.objects.filter(node__name="sim-a100-01").values_list("model", flat=True)) == {
        "NVIDIA A100-SXM4-80GB"
    }
    tenant = Tenant.objects.get(slug=DEMO_TENANT)
    assert "simulated" in tenant.name.lower()
    assert TenantQuota.all_tenants.get(tenant=tenant).limit == 28
    assert sorted(Project.all_tenants.filter(tenant=tenant).values_list("slug", flat=True)) == [
        "sim-language",
        "sim-vision",
    ]
    workloads = Workload.all_tenants.filter(tenant=tenant)
    assert fleet.workloads_added == len(WORK) == workloads.count()
    assert all(w.name.startswith("sim-") and w.state == WorkloadState.PENDING for w in workloads)
    assert "Simulated demo fleet added: 4 nodes" in fleet.summary()


def test_a_scheduling_pass_fills_the_tenants_limit_and_leaves_the_rest_waiting_with_reasons(operator: Actor) -> None:
    add_demo_fleet(actor=operator)
    assert shell.run_pass() is not None
    workloads = list(Workload.all_tenants.filter(tenant__slug=DEMO_TENANT))
    placed = [w for w in workloads if w.state == WorkloadState.SCHEDULED]
    waiting = [w for w in workloads if w.state == WorkloadState.PENDING]
    assert placed and waiting
    assert 0 < sum(w.gpus_per_replica * w.replicas for w in placed) <= 28
    assert all(w.reason_code for w in waiting), [(w.name, w.reason_code) for w in waiting]


def test_asking_twice_adds_nothing_twice(operator: Actor) -> None:
    add_demo_fleet(actor=operator)
    again = add_demo_fleet(actor=operator)
    assert again.nodes_added == 0 and again.workloads_added == 0
    assert "already here" in again.summary()
    assert Node.objects.filter(pool__name=DEMO_POOL).count() == 4
    assert Workload.all_tenants.filter(tenant__slug=DEMO_TENANT).count() == len(WORK)
    assert NodePool.objects.filter(name=DEMO_POOL).count() == 1


def test_only_operators_add_it(operator: Actor) -> None:
    member = Actor(user=User.objects.create_user("someone", "", PASSWORD))
    with pytest.raises(PermissionDenied):
        add_demo_fleet(actor=member)
    assert not Node.objects.exists()


def test_with_an_allow_list_on_the_demo_allows_its_own_images_for_its_tenant_only(operator: Actor) -> None:
    AllowedImage.objects.create(pattern="registry.local/*", notebook=True)
    fleet = add_demo_fleet(actor=operator)
    assert fleet.workloads_added == len(WORK)
    allowed = AllowedImage.objects.get(pattern=DEMO_IMAGES)
    assert allowed.tenant is not None and allowed.tenant.slug == DEMO_TENANT


def test_with_this_machine_registered_the_demo_tenant_gets_a_no_gpu_notebook_preset_there(operator: Actor) -> None:
    register_local_node(actor=operator, name="local", runtime=RuntimeKind.PROCESS, image="gpucloud/jupyter:local")
    add_demo_fleet(actor=operator)
    preset = LaunchPreset.all_tenants.get(tenant__slug=DEMO_TENANT, name=LOCAL_PRESET)
    assert preset.gpus_per_replica == 0 and preset.pool.name == "local" and preset.kind == "notebook"
    assert preset.image == "gpucloud/jupyter:local"
