"""The launch page names every failing field at once and offers the GPU models of the tenant's pools."""

from __future__ import annotations

import html

import pytest

from inventory.models import Gpu, NodePool
from jobs.models import Allocation, Workload
from jobs.scheduler import shell
from jobs.services import images
from tenants.context import Actor
from tenants.models import AuditEvent, ProjectQuota, TenantQuota
from tests.conftest import World
from tests.frontend.test_pages import logged_in
from tests.frontend.test_workload_pages import LAUNCH, _field_error, _launch_form
from tests.inventory.factories import make_node
from tests.jobs.factories import A100, H100, add_node, assign, give_quota

pytestmark = pytest.mark.django_db


@pytest.fixture
def team(world: World) -> World:
    """Alpha can run work (an 8-GPU quota, one ready 8-GPU node, n1) and member_a is on it."""
    give_quota(world)
    make_node(Actor(user=world.operator), world.pool, name="n1", gpus=8, cpu_cores=64, memory_mib=512_000)
    assign(world.member_a, world.project_a)
    return world


def test_a_bad_name_image_and_gpu_count_are_shown_together(team: World) -> None:
    audit_before = AuditEvent.all_tenants.count()
    response = logged_in("member_a").post(
        LAUNCH, _launch_form(team, name="Bad_Name!", image="UPPER CASE", gpus_per_replica=-1)
    )
    assert response.status_code == 400
    page = response.content.decode()
    assert "lowercase letters, digits or hyphens" in _field_error(page, "name")
    assert "Must be an image reference" in _field_error(page, "image")
    assert "Must be between 0 and 64." in _field_error(page, "gpus_per_replica")
    assert not Workload.all_tenants.exists()
    assert AuditEvent.all_tenants.count() == audit_before


def test_what_the_form_cannot_parse_comes_with_the_rules_of_the_rest(team: World) -> None:
    overrides = {"name": "Bad_Name!", "gpus_per_replica": "two", "env": "just words", "command": "python 'unclosed"}
    response = logged_in("member_a").post(LAUNCH, _launch_form(team, replicas=0, **overrides))
    page = response.content.decode()
    assert response.status_code == 400
    assert "Must be a whole number." in _field_error(page, "gpus_per_replica")
    assert "Line 1: write KEY=VALUE." in _field_error(page, "env")
    assert "lowercase letters, digits or hyphens" in _field_error(page, "name")
    assert "Must be between 1 and 64." in _field_error(page, "replicas")
    assert "Cannot split the command" in _field_error(page, "command")
    assert not Workload.all_tenants.exists()


def test_the_form_offers_the_gpu_models_of_the_tenants_pools(team: World) -> None:
    other = NodePool.objects.create(name="a100s")
    TenantQuota.all_tenants.create(tenant=team.tenant_a, pool=other, limit=8)
    node = add_node(team, "n2", gpus=2, model=A100)
    node.pool = other
    node.save(update_fields=["pool"])
    Gpu.objects.filter(node__name="n1").update(model=H100)
    page = logged_in("member_a").get(LAUNCH).content.decode()
    assert '<option value="" selected>Any model</option>' in page
    assert f'<option value="{A100}">{A100} (in a100s)</option>' in page
    assert f'<option value="{H100}">{H100} (in shared)</option>' in page


def test_a_job_launched_with_a_gpu_model_runs_only_on_that_model(team: World) -> None:
    # Two nodes alike but for their GPUs' model; the job asks for the model of the second.
    node = make_node(Actor(user=team.operator), team.pool, name="n2", cpu_cores=64, memory_mib=512_000)
    Gpu.objects.bulk_create(Gpu(node=node, index=i, uuid=f"GPU-n2-{i}", model=A100) for i in range(8))
    response = logged_in("member_a").post(LAUNCH, _launch_form(team, gpu_model=A100, gpus_per_replica=2))
    assert response.status_code == 302, response.content.decode()
    workload = Workload.all_tenants.get(name="train")
    assert workload.gpu_models == [A100]
    shell.run_pass()
    models = set(Allocation.all_tenants.filter(workload=workload).values_list("gpu__model", flat=True))
    assert models == {A100}
    # Any model: the form sends none, and the scheduler may place it anywhere in the pool.
    logged_in("member_a").post(LAUNCH, _launch_form(team, name="anywhere", gpu_model=""))
    assert Workload.all_tenants.get(name="anywhere").gpu_models == []


def test_a_model_the_chosen_pool_lacks_is_refused_next_to_the_field(team: World) -> None:
    other = NodePool.objects.create(name="a100s")
    node = add_node(team, "n2", gpus=2, model=A100)
    node.pool = other
    node.save(update_fields=["pool"])
    Gpu.objects.filter(node__name="n1").update(model=H100)
    response = logged_in("member_a").post(LAUNCH, _launch_form(team, gpu_model=A100))
    assert response.status_code == 400
    assert f"Pool shared has no {A100} GPUs" in _field_error(response.content.decode(), "gpu_model")
    assert not Workload.all_tenants.exists()


def test_a_bad_name_an_image_off_the_allow_list_and_gpus_over_the_limit_are_shown_together(team: World) -> None:
    ProjectQuota.all_tenants.filter(project=team.project_a).update(limit=2)
    images.create_allowed_image(actor=Actor(user=team.operator), pattern="registry.example.com/*", tenant=None)
    form = _launch_form(team, name="Bad_Name!", image="docker.io/evil:1", gpus_per_replica=4)
    response = logged_in("member_a").post(LAUNCH, form)
    assert response.status_code == 400
    page = html.unescape(response.content.decode())
    assert "lowercase letters, digits or hyphens" in _field_error(page, "name")
    assert "is not on this tenant's list of allowed images" in _field_error(page, "image")
    assert "4 GPUs exceed project alpha's limit of 2" in _field_error(page, "gpus_per_replica")
    assert not Workload.all_tenants.exists()


def test_what_the_form_cannot_parse_comes_with_the_database_rules_of_the_rest(team: World) -> None:
    images.create_allowed_image(actor=Actor(user=team.operator), pattern="registry.example.com/*", tenant=None)
    form = _launch_form(team, name="Bad_Name!", image="docker.io/evil:1", gpus_per_replica="lots")
    response = logged_in("member_a").post(LAUNCH, form)
    assert response.status_code == 400
    page = html.unescape(response.content.decode())
    assert "Must be a whole number." in _field_error(page, "gpus_per_replica")
    assert "lowercase letters, digits or hyphens" in _field_error(page, "name")
    assert "is not on this tenant's list of allowed images" in _field_error(page, "image")
    assert not Workload.all_tenants.exists()
