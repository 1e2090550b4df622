"""Submission and cancellation through the services: every rule, idempotency, all-or-nothing, personas, CAS."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection
from django.http import Http404
from django.utils import timezone

from common.errors import Conflict
from common.task_names import SCHEDULE_PASS
from inventory.models import NodePool
from jobs import services
from jobs.choices import WorkloadState
from jobs.models import Allocation, Workload, WorkloadEvent
from tenants.context import Actor
from tenants.models import AuditEvent, Project
from tests.conftest import World
from tests.jobs.factories import A100, H100, add_node, assign, give_quota, ready_world, request

pytestmark = pytest.mark.django_db


def _submit(world: World, user: Any = None, project: Project | None = None, **overrides: Any) -> Workload:
    return services.submit_workload(
        actor=Actor(user=user or world.member_a), project=project or world.project_a, data=request(world, **overrides)
    )


def _refusal(call: Callable[[], object]) -> tuple[str, str, str]:
    """Run `call`, expect a ValidationError, return (field, code, message) of its first error."""
    with pytest.raises(ValidationError) as caught:
        call()
    field, errors = next(iter(caught.value.error_dict.items()))
    return field, str(errors[0].code), errors[0].messages[0]


def test_a_member_submits_into_their_project(world: World) -> None:
    ready_world(world)
    workload = _submit(world, gpus_per_replica=2, command=["python", "train.py"], env={"EPOCHS": "3"})
    assert (workload.state, workload.owner, workload.total_gpus) == (WorkloadState.PENDING, world.member_a, 2)
    assert workload.tenant_id == world.tenant_a.pk
    events = WorkloadEvent.all_tenants.filter(workload=workload)
    assert [(e.kind, e.to_state) for e in events] == [("workload.submitted", "pending")]
    assert events[0].message == "Submitted by member_a: 2 GPU(s) in pool shared."
    assert AuditEvent.all_tenants.filter(action="workload.submit", object_id=str(workload.pk)).count() == 1


@pytest.mark.parametrize(
    ("overrides", "field", "code"),
    [
        ({"name": "Not_A_Name"}, "name", "invalid_name"),
        ({"image": "UPPER/case"}, "image", "invalid_image"),
        ({"image": "a b"}, "image", "invalid_image"),
        ({"env": {"LD_PRELOAD": "/x.so"}}, "env.LD_PRELOAD", "forbidden_env"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0,1"}}, "env.CUDA_VISIBLE_DEVICES", "forbidden_env"),
        ({"env": {"1BAD": "x"}}, "env.1BAD", "invalid_env_name"),
        ({"command": ["ok", 3]}, "command[1]", "invalid_value"),
        ({"gpus_per_replica": 65}, "gpus_per_replica", "out_of_range"),
        ({"replicas": 0}, "replicas", "out_of_range"),
        ({"kind": "daemon"}, "kind", "invalid_choice"),
        ({"priority_class": "urgent"}, "priority_class", "invalid_choice"),
        ({"max_runtime_seconds": 5}, "max_runtime_seconds", "out_of_range"),
        ({"gpu_models": [""]}, "gpu_models", "invalid"),
        ({"privileged": True}, "privileged", "unknown_field"),
    ],
)
def test_field_rules(world: World, overrides: dict[str, Any], field: str, code: str) -> None:
    ready_world(world)
    assert _refusal(lambda: _submit(world, **overrides))[:2] == (field, code)
    assert not Workload.all_tenants.exists()


def test_no_quota_in_the_pool(world: World) -> None:
    add_node(world)
    assign(world.member_a, world.project_a)
    field, code, message = _refusal(lambda: _submit(world))
    assert (field, code) == ("pool", "no_quota")
    assert "no quota in pool shared" in message


def test_a_pool_dedicated_to_another_tenant(world: World) -> None:
    ready_world(world)
    private = NodePool.objects.create(name="private", dedicated_tenant=world.tenant_b)
    assert _refusal(lambda: _submit(world, pool=private))[:2] == ("pool", "pool_dedicated")


def test_more_gpus_than_the_project_limit(world: World) -> None:
    ready_world(world)
    add_node(world, "n2")
    field, code, message = _refusal(lambda: _submit(world, gpus_per_replica=8, replicas=2))
    assert (field, code) == ("gpus_per_replica", "above_quota_limit")
    assert "16 GPUs exceed project alpha's limit of 8" in message


def test_more_gpus_per_replica_than_any_node_has(world: World) -> None:
    give_quota(world, limit=16)
    add_node(world, gpus=4)
    add_node(world, "n2", gpus=4)
    assign(world.member_a, world.project_a)
    field, code, message = _refusal(lambda: _submit(world, gpus_per_replica=8))
    assert (field, code) == ("gpus_per_replica", "exceeds_largest_placement")
    assert "the largest has 4" in message
    assert _submit(world, gpus_per_replica=4, replicas=2).replicas == 2
    assert _refusal(lambda: _submit(world, gpus_per_replica=3, replicas=3))[:2] == (
        "replicas",
        "exceeds_largest_placement",
    )


def test_gpu_models_must_exist_in_the_pool_and_narrow_the_placement(world: World) -> None:
    give_quota(world, limit=16)
    add_node(world, gpus=8, model=H100)
    add_node(world, "small", gpus=2, model=A100)
    assign(world.member_a, world.project_a)
    field, code, message = _refusal(lambda: _submit(world, gpu_models=["NVIDIA B200"]))
    assert (field, code) == ("gpu_models", "unknown_gpu_model")
    assert H100 in message
    assert _refusal(lambda: _submit(world, gpu_models=[A100], gpus_per_replica=4))[1] == "exceeds_largest_placement"
    assert _submit(world, gpu_models=[A100], gpus_per_replica=2).gpu_models == [A100]


def test_a_cpu_only_workload_needs_no_gpu(world: World) -> None:
    give_quota(world, limit=0)
    assign(world.member_a, world.project_a)
    assert _submit(world, gpus_per_replica=0).total_gpus == 0


def test_max_pending_workloads_per_project(world: World) -> None:
    give_quota(world, max_pending_workloads=2)
    add_node(world)
    assign(world.member_a, world.project_a)
    _submit(world)
    _submit(world)
    field, code, message = _refusal(lambda: _submit(world))
    assert (field, code) == ("project", "max_pending_workloads")
    assert "limit of 2" in message
    Workload.all_tenants.filter(pk__in=Workload.all_tenants.values("pk")[:1]).update(state=WorkloadState.RUNNING)
    _submit(world)


def test_the_tenant_count_limit_applies_when_the_project_sets_none(world: World) -> None:
    world.quota_a.max_pending_workloads = 1
    world.quota_a.save()
    ready_world(world)
    _submit(world)
    assert _refusal(lambda: _submit(world))[1] == "max_pending_workloads"


def test_max_notebooks_per_user(world: World) -> None:
    give_quota(world, max_notebooks_per_user=1)
    add_node(world)
    assign(world.member_a, world.project_a)
    _submit(world, kind="notebook")
    assert _refusal(lambda: _submit(world, kind="notebook"))[:2] == ("kind", "max_notebooks_per_user")
    _submit(world, kind="job")  # jobs do not count
    _submit(world, world.admin_a, kind="notebook")  # per user


def test_max_runtime_defaults_to_the_quota_and_cannot_exceed_it(world: World) -> None:
    give_quota(world, max_runtime_seconds=3600)
    add_node(world)
    assign(world.member_a, world.project_a)
    assert _submit(world).max_runtime_seconds == 3600
    assert _submit(world, max_runtime_seconds=600).max_runtime_seconds == 600
    assert _refusal(lambda: _submit(world, max_runtime_seconds=7200))[:2] == (
        "max_runtime_seconds",
        "above_max_runtime",
    )


# --- personas ---------------------------------------------------------------------------


def test_a_member_cannot_submit_into_a_project_they_are_not_on(world: World) -> None:
    give_quota(world)
    add_node(world)
    with pytest.raises(PermissionDenied, match="not a member of project alpha"):
        _submit(world)


def test_admins_and_operators_submit_into_any_project_viewers_never(world: World) -> None:
    ready_world(world)
    assert _submit(world, world.admin_a).owner == world.admin_a
    assert _submit(world, world.operator).owner == world.operator
    with pytest.raises(PermissionDenied):
        _submit(world, world.viewer_a)
    with pytest.raises(Http404):
        _submit(world, world.admin_b)
    assert Workload.all_tenants.count() == 2


# --- idempotency and bulk ----------------------------------------------------------------


def test_a_retried_key_returns_the_first_workload(world: World) -> None:
    ready_world(world)
    actor = Actor(user=world.member_a)
    first = services.submit(actor=actor, project=world.project_a, items=[request(world)], idempotency_key="k-1")
    again = services.submit(actor=actor, project=world.project_a, items=[request(world)], idempotency_key="k-1")
    assert (first.created, again.created) == (True, False)
    assert again.workloads[0].pk == first.workloads[0].pk
    assert Workload.all_tenants.count() == 1
    assert AuditEvent.all_tenants.filter(action="workload.submit").count() == 1


def test_a_reused_key_with_another_body_is_a_conflict(world: World) -> None:
    ready_world(world)
    services.submit_workload(
        actor=Actor(user=world.member_a), project=world.project_a, data=request(world), idempotency_key="k"
    )
    with pytest.raises(Conflict) as caught:
        services.submit_workload(
            actor=Actor(user=world.member_a),
            project=world.project_a,
            data=request(world, gpus_per_replica=2),
            idempotency_key="k",
        )
    assert caught.value.code == "idempotency_key_reused"
    # The key is the caller's own: another user's identical key is another request.
    services.submit_workload(
        actor=Actor(user=world.admin_a), project=world.project_a, data=request(world), idempotency_key="k"
    )
    assert Workload.all_tenants.count() == 2


def test_bulk_is_all_or_nothing_and_names_the_item(world: World) -> None:
    ready_world(world)
    items = [request(world, name=f"job-{i}") for i in range(5)]
    items[3] = request(world, name="job-3", env={"DOCKER_HOST": "tcp://x"})
    field, code, _ = _refusal(
        lambda: services.submit_workloads(actor=Actor(user=world.member_a), project=world.project_a, items=items)
    )
    assert (field, code) == ("items[3].env.DOCKER_HOST", "forbidden_env")
    assert not Workload.all_tenants.exists()
    assert not WorkloadEvent.all_tenants.exists()


def test_bulk_counts_its_own_items_against_the_limits(world: World) -> None:
    give_quota(world, max_pending_workloads=3)
    add_node(world)
    assign(world.member_a, world.project_a)
    items = [request(world, name=f"job-{i}") for i in range(4)]
    actor = Actor(user=world.member_a)
    assert _refusal(lambda: services.submit_workloads(actor=actor, project=world.project_a, items=items))[1] == (
        "max_pending_workloads"
    )
    created = services.submit_workloads(actor=actor, project=world.project_a, items=items[:3], idempotency_key="b")
    assert [w.name for w in created] == ["job-0", "job-1", "job-2"]
    assert AuditEvent.all_tenants.filter(action="workload.submit").count() == 1
    assert WorkloadEvent.all_tenants.filter(kind="workload.submitted").count() == 3
    replay = services.submit_workloads(actor=actor, project=world.project_a, items=items[:3], idempotency_key="b")
    assert [w.pk for w in replay] == [w.pk for w in created]


def test_bulk_validation_is_set_based(world: World, django_assert_max_num_queries: Any) -> None:
    ready_world(world)
    items = [request(world, name=f"job-{i}") for i in range(300)]
    # SQLite splits big INSERTs at its bound-variable limit; one query per item would be 300 or more.
    with django_assert_max_num_queries(40):
        services.submit_workloads(actor=Actor(user=world.member_a), project=world.project_a, items=items)
    assert Workload.all_tenants.count() == 300


# --- cancel and transitions ------------------------------------------------------------------


def test_a_member_cancels_their_own_and_the_gpus_are_released(world: World) -> None:
    ready_world(world)
    workload = _submit(world)
    gpu = add_node(world, "n2", gpus=1).gpus.get()
    Workload.all_tenants.filter(pk=workload.pk).update(state=WorkloadState.RUNNING)
    Allocation.all_tenants.create(tenant=world.tenant_a, workload=workload, replica=0, node=gpu.node, gpu=gpu)
    cancelled = services.cancel_workload(actor=Actor(user=world.member_a), workload=workload)
    assert (cancelled.state, cancelled.reason_code) == (WorkloadState.CANCELLED, "CANCELLED_BY_USER")
    assert cancelled.finished_at is not None
    assert not Allocation.all_tenants.filter(released_at__isnull=True).exists()
    last = WorkloadEvent.all_tenants.filter(workload=workload).last()
    assert last is not None and (last.from_state, last.to_state) == ("running", "cancelled")
    assert AuditEvent.all_tenants.filter(action="workload.cancel").count() == 1


def test_cancelling_an_ended_workload_is_a_conflict_with_its_state(world: World) -> None:
    ready_world(world)
    workload = _submit(world)
    Workload.all_tenants.filter(pk=workload.pk).update(state=WorkloadState.SUCCEEDED)
    with pytest.raises(Conflict) as caught:
        services.cancel_workload(actor=Actor(user=world.member_a), workload=workload)
    assert caught.value.details["current_state"] == "succeeded"
    assert WorkloadEvent.all_tenants.filter(kind="workload.state_changed").count() == 0


def test_members_cancel_only_their_own_admins_any(world: World) -> None:
    ready_world(world)
    mine = _submit(world, world.admin_a)
    with pytest.raises(PermissionDenied):
        services.cancel_workload(actor=Actor(user=world.member_a), workload=mine)
    with pytest.raises(PermissionDenied):
        services.cancel_workload(actor=Actor(user=world.viewer_a), workload=mine)
    theirs = _submit(world)
    assert services.cancel_workload(actor=Actor(user=world.admin_a), workload=theirs).state == "cancelled"


def test_transition_is_compare_and_swap(world: World) -> None:
    ready_world(world)
    workload = _submit(world)
    move: dict[str, Any] = {"workload_id": workload.pk, "from_states": ["pending"], "to_state": "scheduled"}
    assert services.transition_workload(**move, scheduled_at=timezone.now(), reason_code="", message="placed")
    assert not services.transition_workload(**move)  # already moved: the second worker loses
    assert Workload.all_tenants.get(pk=workload.pk).scheduled_at is not None
    assert WorkloadEvent.all_tenants.filter(kind="workload.state_changed").count() == 1
    with pytest.raises(ValueError, match="cannot go from pending to running"):
        services.transition_workload(workload_id=workload.pk, from_states=["pending"], to_state="running")


def test_submission_asks_for_a_scheduling_pass_after_commit(
    world: World, django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from common import control

    sent: list[str] = []
    monkeypatch.setattr(control.app, "send_task", lambda name, **kwargs: sent.append(name))
    control._release(SCHEDULE_PASS)
    ready_world(world)
    with django_capture_on_commit_callbacks(execute=True):
        _submit(world)
        _submit(world)
    # Coalesced: two submissions, one pass waiting (it has not started, so the second merged into it).
    assert sent == [SCHEDULE_PASS]
    assert control.queued(SCHEDULE_PASS)
    control._release(SCHEDULE_PASS)


# --- concurrency (Postgres) -----------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_submissions_never_pass_the_pending_limit(world: World) -> None:
    """200 submissions at once against a limit of 50 (10 already pending): exactly 40 get in."""
    limit, already, attempts = 50, 10, 200
    give_quota(world, max_pending_workloads=limit)
    add_node(world)
    assign(world.member_a, world.project_a)
    services.submit_workloads(
        actor=Actor(user=world.admin_a),
        project=world.project_a,
        items=[request(world, name=f"old-{i}") for i in range(already)],
    )
    outcomes: list[str] = []
    barrier = threading.Barrier(16)
    lock = threading.Lock()

    def submit(worker: int) -> None:
        try:
            barrier.wait(timeout=30)
            for i in range(worker, attempts, 16):
                try:
                    _submit(world, name=f"job-{i}")
                    result = "created"
                except ValidationError as error:
                    result = next(iter(error.error_dict.values()))[0].code or "invalid"
                with lock:
                    outcomes.append(result)
        finally:
            connection.close()

    threads = [threading.Thread(target=submit, args=(w,)) for w in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(outcomes) == attempts
    assert outcomes.count("created") == limit - already
    assert set(outcomes) == {"created", "max_pending_workloads"}
    assert Workload.all_tenants.filter(state="pending").count() == limit


# --- the submission response ----------------------------------------------------------------


def test_the_fast_response_renders_exactly_what_the_serializer_does(world: World) -> None:
    from jobs.api.serializers import WorkloadSerializer, workload_rows

    ready_world(world)
    created = services.submit_workloads(
        actor=Actor(user=world.member_a),
        project=world.project_a,
        items=[
            request(world, name="a", kind="notebook", env={"A": "1"}, command=["python", "x.py"]),
            request(world, name="b", gpu_models=[H100], max_runtime_seconds=600, priority_class="high"),
        ],
    )
    moved = timezone.now()
    Workload.all_tenants.filter(pk=created[1].pk).update(
        state=WorkloadState.FAILED, scheduled_at=moved, finished_at=moved, exit_code=3, reason_code="EXIT_NONZERO"
    )
    stored = list(Workload.all_tenants.select_related("project", "pool", "owner").order_by("pk"))
    for workloads in (created, stored):
        assert workload_rows(workloads) == WorkloadSerializer(workloads, many=True).data


def test_a_batch_takes_its_requests_in_order_whoever_sends_them(world: World) -> None:
    give_quota(world, max_pending_workloads=1)
    add_node(world)
    assign(world.member_a, world.project_a)

    def submission(user: Any, name: str) -> services.SubmissionRequest:
        return services.SubmissionRequest(
            actor=Actor(user=user), project=world.project_a, items=[request(world, name=name)]
        )

    # The member's request came first: it takes the one pending slot, although the admin's needs no assignment check.
    first, second = services.submit_batch([submission(world.member_a, "first"), submission(world.admin_a, "second")])
    assert isinstance(first, services.Submission) and first.workloads[0].name == "first"
    assert isinstance(second, ValidationError) and "max_pending_workloads" in str(second.error_dict["project"][0].code)
    assert list(Workload.all_tenants.values_list("name", flat=True)) == ["first"]
