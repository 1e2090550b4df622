"""Workloads and their volumes: what a replica mounts, where it may be placed, hibernate and resume, checkpoints.

These run the real services on the embedded database: mounts resolved from
the ledger, the scheduler's storage rule, the notebook lifecycle through
hibernation, and checkpoints seen in a real directory.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from django.utils import timezone

from common.errors import Conflict
from inventory.choices import StorageKind, VolumeKind
from inventory.drivers.storage import newest_file_time
from inventory.models import Gpu, Node, StorageBackend, Volume
from inventory.services import mounts
from inventory.services.storage import MARKER_FILE, create_storage_backend, default_backend
from inventory.services.volume_access import volume_rights
from inventory.services.volumes import create_volume, share_volume
from jobs.choices import ReasonCode, WorkloadKind, WorkloadState
from jobs.models import Allocation, Replica, ReplicaState, Workload, WorkloadEvent
from jobs.scheduler.shell import run_pass
from jobs.services import hibernate_notebook, resume_notebook, submit_workload
from jobs.services.checkpoints import record_checkpoint
from jobs.services.execution import _placements, container_name, replica_spec, workload_storage
from jobs.services.stopping import settle_workload
from tenants.context import Actor
from tenants.models import Project
from tests.conftest import World, actor
from tests.inventory.factories import make_node
from tests.jobs.factories import assign, give_quota, request

pytestmark = pytest.mark.django_db


def _node(world: World, name: str = "n1", *, gpus: int = 2, **kwargs: Any) -> Any:
    node = make_node(Actor(user=world.operator), world.pool, name=name, cpu_cores=64, memory_mib=512_000, **kwargs)
    Gpu.objects.bulk_create(Gpu(node=node, index=i, uuid=f"GPU-{name}-{i}", model="H100") for i in range(gpus))
    return node


def ready_world(world: World) -> World:
    give_quota(world)
    _node(world)
    assign(world.member_a, world.project_a)
    return world


def _submit(world: World, **overrides: Any) -> Workload:
    return submit_workload(actor=actor(world.member_a), project=world.project_a, data=request(world, **overrides))


def _placed(world: World, **overrides: Any) -> Workload:
    workload = _submit(world, **overrides)
    run_pass()
    workload.refresh_from_db()
    assert workload.state == WorkloadState.SCHEDULED, workload.reason_message
    return workload


def _running(workload: Workload) -> Workload:
    Workload.all_tenants.filter(pk=workload.pk).update(state=WorkloadState.RUNNING, started_at=timezone.now())
    workload.refresh_from_db()
    return workload


# --- what a replica mounts ----------------------------------------------------------


def test_a_replica_mounts_its_owners_home_its_projects_volumes_and_shared_datasets(world: World) -> None:
    ready_world(world)
    other = Project.all_tenants.create(tenant=world.tenant_a, slug="gamma", name="Gamma")
    admin = actor(world.admin_a)
    create_volume(actor=admin, tenant=world.tenant_a, kind=VolumeKind.DATASET, name="imagenet", project=other)
    scratch = create_volume(actor=admin, tenant=world.tenant_a, kind=VolumeKind.PROJECT, name="scratch", project=other)
    share_volume(actor=admin, volume=Volume.all_tenants.get(name="imagenet"), project=world.project_a, read_only=True)
    share_volume(actor=admin, volume=scratch, project=world.project_a, read_only=False)
    workload = _placed(world)
    spec = replica_spec(workload, 0, _placements(workload.pk)).to_wire()
    targets = {m["target"]: m for m in spec["mounts"]}
    assert spec["mounts"][0]["target"] == "/home/member_a" == spec["workdir"] == spec["env"]["HOME"]
    assert set(targets) == {"/home/member_a", "/projects/alpha", "/datasets/imagenet", "/projects/scratch"}
    assert targets["/datasets/imagenet"]["read_only"] is True
    assert targets["/projects/scratch"]["read_only"] is False
    assert targets["/projects/alpha"]["read_only"] is False
    backend = default_backend()
    for mount in spec["mounts"]:
        assert mount["root"] == backend.path and mount["marker"] == backend.marker
        assert mount["source"].startswith(backend.path.rstrip("/") + "/t")
    home = Volume.all_tenants.get(kind=VolumeKind.HOME, owner=world.member_a)
    assert targets["/home/member_a"]["uid"] == mounts.uid_of(world.member_a) == spec["run_as"]["uid"]
    assert targets["/home/member_a"]["mode"] == 0o700 and home.tenant_id == world.tenant_a.pk
    assert spec["run_as"]["gid"] == mounts.gid_of(world.project_a.pk)
    assert mounts.gid_of(other.pk) in spec["run_as"]["groups"], "the shared volumes' group"
    assert spec["env"]["GPUCLOUD_CHECKPOINT_DIR"] == f"/projects/alpha/.checkpoints/{workload.pk}"
    assert spec["stop_signal"] == "SIGTERM"


def test_the_checkpoint_directory_and_home_are_the_same_for_every_attempt(world: World) -> None:
    ready_world(world)
    workload = _placed(world, stop_signal="SIGUSR1")
    first = workload_storage(workload)
    Workload.all_tenants.filter(pk=workload.pk).update(attempt=2)
    workload.refresh_from_db()
    second = workload_storage(workload)
    assert first == second
    assert replica_spec(workload, 0, _placements(workload.pk)).stop_signal == "SIGUSR1"
    assert Volume.all_tenants.filter(kind=VolumeKind.HOME).count() == 1, "the home is made once"


def test_homes_are_per_user_and_tenant_and_invisible_across_tenants(world: World) -> None:
    ready_world(world)
    workload_storage(_placed(world))
    assert Volume.all_tenants.filter(tenant=world.tenant_b).count() == 0
    home = Volume.all_tenants.get(kind=VolumeKind.HOME)
    with pytest.raises(Http404):
        volume_rights(actor(world.admin_b), home)


def test_a_bad_stop_signal_is_refused_naming_the_field(world: World) -> None:
    ready_world(world)
    with pytest.raises(ValidationError) as refused:
        _submit(world, stop_signal="SIGKILL")
    assert "stop_signal" in str(refused.value)
    assert Workload.all_tenants.count() == 0


# --- placement only where the volumes can be mounted --------------------------------


def _process_node(world: World, name: str, **kwargs: Any) -> Any:
    return _node(world, name, runtime="process", **kwargs)


def test_a_workload_is_placed_only_on_a_node_that_can_mount_its_volumes(world: World, tmp_path: Path) -> None:
    give_quota(world)
    assign(world.member_a, world.project_a)
    _process_node(world, "n1")
    local = _process_node(world, "n2")
    backend = create_storage_backend(
        actor=actor(world.operator), name="n2-disk", kind=StorageKind.LOCAL, path=str(tmp_path / "n2"), node=local
    )
    create_volume(
        actor=actor(world.admin_a),
        tenant=world.tenant_a,
        kind=VolumeKind.DATASET,
        name="local-data",
        project=world.project_a,
        backend=backend,
    )
    for index in range(2):
        workload = _placed(world, name=f"w{index}")
        assert {a.node.name for a in Allocation.all_tenants.filter(workload=workload)} == {"n2"}


def test_no_node_that_can_mount_its_volumes_keeps_it_waiting_and_says_why(world: World, tmp_path: Path) -> None:
    give_quota(world)
    assign(world.member_a, world.project_a)
    _process_node(world, "n1")
    elsewhere = _process_node(world, "n9", state="cordoned")
    backend = create_storage_backend(
        actor=actor(world.operator), name="n9-disk", kind=StorageKind.LOCAL, path=str(tmp_path / "n9"), node=elsewhere
    )
    create_volume(
        actor=actor(world.admin_a),
        tenant=world.tenant_a,
        kind=VolumeKind.DATASET,
        name="stuck",
        project=world.project_a,
        backend=backend,
    )
    workload = _submit(world)
    run_pass()
    workload.refresh_from_db()
    assert workload.state == WorkloadState.PENDING
    assert workload.reason_code == ReasonCode.NO_STORAGE
    assert "n9-disk" in workload.reason_message


def test_a_shared_backend_is_mountable_only_in_the_pools_it_names(world: World, tmp_path: Path) -> None:
    from inventory.models import NodePool
    from inventory.services.storage import mountable_backends

    other_pool = NodePool.objects.create(name="other")
    n1 = _process_node(world, "n1")
    shared = create_storage_backend(
        actor=actor(world.operator),
        name="nfs",
        kind=StorageKind.SHARED,
        path=str(tmp_path / "nfs"),
        pools=[other_pool],
    )
    assert (tmp_path / "nfs" / MARKER_FILE).read_text().strip() == shared.marker
    assert "nfs" not in mountable_backends(n1, [shared], {shared.pk: {other_pool.pk}})
    assert "nfs" in mountable_backends(n1, [shared], {})


def test_a_backend_root_is_never_shared_and_every_failing_field_is_named(world: World, tmp_path: Path) -> None:
    operator = actor(world.operator)
    create_storage_backend(actor=operator, name="one", kind=StorageKind.SHARED, path=str(tmp_path / "r"))
    with pytest.raises(Conflict):
        create_storage_backend(actor=operator, name="two", kind=StorageKind.SHARED, path=str(tmp_path / "r"))
    with pytest.raises(ValidationError) as refused:
        create_storage_backend(actor=operator, name="Bad Name", kind=StorageKind.LOCAL, path="relative/path")
    fields = set(refused.value.message_dict)
    assert {"name", "path", "node"} <= fields
    assert StorageBackend.objects.filter(name="two").count() == 0
    with pytest.raises(PermissionDenied):
        create_storage_backend(actor=actor(world.admin_a), name="mine", kind=StorageKind.SHARED, path=str(tmp_path))


# --- hibernate and resume ---------------------------------------------------------------


def _notebook(world: World) -> Workload:
    ready_world(world)
    return _running(_placed(world, kind=WorkloadKind.NOTEBOOK, name="nb", image="registry.example.com/jupyter:1"))


def test_hibernate_frees_the_gpu_and_resume_queues_the_same_notebook_again(world: World) -> None:
    from jobs.models import AllowedImage

    AllowedImage.objects.create(pattern="registry.example.com/*", notebook=True)
    notebook = _notebook(world)
    home = workload_storage(notebook).mounts[0]["source"]
    hibernated = hibernate_notebook(actor=actor(world.member_a), workload=notebook)
    assert hibernated.state == WorkloadState.HIBERNATED
    assert hibernated.reason_code == ReasonCode.HIBERNATED_BY_USER
    assert not Allocation.all_tenants.filter(workload=hibernated, released_at__isnull=True).exists()
    assert hibernate_notebook(actor=actor(world.member_a), workload=hibernated).state == WorkloadState.HIBERNATED
    resumed = resume_notebook(actor=actor(world.member_a), workload=hibernated)
    assert (resumed.state, resumed.attempt, resumed.reason_code) == (WorkloadState.PENDING, 2, ReasonCode.RESUMED)
    assert (resumed.image, resumed.gpus_per_replica, resumed.pool_id) == (notebook.image, 1, notebook.pool_id)
    again = resume_notebook(actor=actor(world.member_a), workload=resumed)
    assert again.attempt == 2, "a second Resume is a no-op"
    run_pass()
    resumed.refresh_from_db()
    assert resumed.state == WorkloadState.SCHEDULED
    assert workload_storage(resumed).mounts[0]["source"] == home, "the same home comes back"


def test_only_the_owner_or_an_admin_hibernates_and_never_across_tenants(world: World) -> None:
    from jobs.models import AllowedImage

    AllowedImage.objects.create(pattern="registry.example.com/*", notebook=True)
    notebook = _notebook(world)
    with pytest.raises(PermissionDenied):
        hibernate_notebook(actor=actor(world.viewer_a), workload=notebook)
    with pytest.raises(Http404):
        hibernate_notebook(actor=actor(world.admin_b), workload=notebook)
    with pytest.raises(Http404):
        resume_notebook(actor=actor(world.admin_b), workload=notebook)
    assert hibernate_notebook(actor=actor(world.admin_a), workload=notebook).state == WorkloadState.HIBERNATED


def test_a_batch_job_does_not_hibernate(world: World) -> None:
    ready_world(world)
    job = _running(_placed(world))
    with pytest.raises(Conflict) as refused:
        hibernate_notebook(actor=actor(world.member_a), workload=job)
    assert refused.value.code == "not_a_notebook"


def test_a_notebook_preempted_for_other_work_hibernates_once_stopped(world: World) -> None:
    from jobs.models import AllowedImage

    AllowedImage.objects.create(pattern="registry.example.com/*", notebook=True)
    notebook = _notebook(world)
    Workload.all_tenants.filter(pk=notebook.pk).update(state=WorkloadState.PREEMPTED, reason_code="RECLAIM_GUARANTEE")
    assert settle_workload(workload_id=notebook.pk)
    notebook.refresh_from_db()
    assert notebook.state == WorkloadState.HIBERNATED
    assert notebook.reason_code == "RECLAIM_GUARANTEE"
    assert resume_notebook(actor=actor(world.member_a), workload=notebook).state == WorkloadState.PENDING


# --- checkpoints ----------------------------------------------------------------------------------


def test_a_reported_checkpoint_is_recorded_once_and_only_a_newer_one_moves_it(world: World) -> None:
    ready_world(world)
    job = _running(_placed(world))
    replica = Replica.all_tenants.create(
        tenant=world.tenant_a, workload=job, attempt=job.attempt, index=0, node=Node.objects.get(name="n1"),
        name=container_name(job.pk, 0, 1), state=ReplicaState.RUNNING,
    )  # fmt: skip
    written = time.time() - 30

    def report(at: float, attempt: int = job.attempt, index: int = 0) -> bool:
        return record_checkpoint(workload_id=job.pk, attempt=attempt, replica=index, at=at)

    assert report(written)
    job.refresh_from_db()
    assert job.checkpointed_at is not None and abs(job.checkpointed_at.timestamp() - written) < 0.01
    assert not report(written), "the same checkpoint is not recorded twice"
    assert not report(written - 10), "an older report arriving late changes nothing"
    assert not report(written + 5, attempt=job.attempt + 1), "another attempt's report is not this one's"
    assert not report(written + 5, index=1), "only a replica of the job that runs reports"
    assert not report(time.time() + 600), "a node clock ahead of the console's is no checkpoint yet"
    assert WorkloadEvent.all_tenants.filter(workload=job, kind="workload.checkpoint").count() == 1
    assert report(written + 20)
    job.refresh_from_db()
    assert job.checkpointed_at.timestamp() > written + 19
    Replica.all_tenants.filter(pk=replica.pk).update(state=ReplicaState.EXITED)
    assert not report(written + 25), "an ended replica's report is late news"


def test_the_nodes_learn_where_a_jobs_checkpoints_are_and_a_notebook_has_none(world: World) -> None:
    ready_world(world)
    job = _placed(world, replicas=2)
    storage = workload_storage(job)
    placements = _placements(job.pk)
    first, second = (replica_spec(job, index, placements, storage).to_wire() for index in (0, 1))
    home, project = storage.mounts[0], storage.mounts[1]
    assert first["checkpoint_dir"] == f"{project['source']}/.checkpoints/{job.pk}"
    assert project["subdirs"] == [f".checkpoints/{job.pk}"] and home["subdirs"] == []
    assert second["checkpoint_dir"] == "", "one replica's node reports for the whole gang"
    node_view = mounts.checkpoint_host_dirs([(job.pk, world.project_a.pk)], console=False)[job.pk]
    assert node_view == first["checkpoint_dir"], "reconcile's watch names the same directory as the start"


def test_a_symlink_in_the_checkpoint_directory_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("x")
    inside = tmp_path / "ckpt"
    inside.mkdir()
    (inside / "link").symlink_to(outside)
    assert newest_file_time(str(inside)) is None
    (inside / "step-1.pt").write_bytes(b"w")
    assert newest_file_time(str(inside)) == (inside / "step-1.pt").stat().st_mtime


def test_a_preemption_records_the_work_it_threw_away(world: World, settings: Any) -> None:
    settings.SCHEDULER_MIN_RUNTIME_SECONDS = 0
    from tenants.models import ProjectQuota, TenantQuota

    gamma = Project.all_tenants.create(tenant=world.tenant_a, slug="gamma", name="Gamma")
    assign(world.member_a, world.project_a)
    assign(world.member_a, gamma)
    TenantQuota.all_tenants.filter(pk=world.quota_a.pk).update(guaranteed=4, limit=4)
    for project in (world.project_a, gamma):
        ProjectQuota.all_tenants.create(tenant=world.tenant_a, project=project, pool=world.pool, guaranteed=2, limit=4)
    _node(world, gpus=4)
    hour_ago = timezone.now() - timedelta(hours=1)
    older = _submit(world, name="older", gpus_per_replica=2)
    borrower = _submit(world, name="borrower", gpus_per_replica=2)
    run_pass(now=hour_ago)
    Workload.all_tenants.filter(pk=older.pk).update(state=WorkloadState.RUNNING, started_at=hour_ago)
    Workload.all_tenants.filter(pk=borrower.pk).update(
        state=WorkloadState.RUNNING, started_at=hour_ago, checkpointed_at=timezone.now() - timedelta(minutes=10)
    )
    submit_workload(actor=actor(world.member_a), project=gamma, data=request(world, name="owed", gpus_per_replica=2))
    run_pass()
    victim = Workload.all_tenants.get(pk=borrower.pk)
    assert victim.state == WorkloadState.PREEMPTED or victim.attempt == 2
    assert 2 * 590 <= victim.lost_gpu_seconds <= 2 * 700, "two GPUs for about ten minutes since the checkpoint"
    event = WorkloadEvent.all_tenants.filter(workload=borrower, to_state=WorkloadState.PREEMPTED).get()
    assert "20 GPU-minutes of work since its last checkpoint" in event.message
