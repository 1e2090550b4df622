"""The data scientist's workload pages: the list, launching, one workload's page and its actions.

Personas: member_a owns the workloads; `other_a` is another member of the
same tenant on the same project; admin_a administers the tenant; viewer_a
reads; admin_b, of another tenant, finds nothing (404).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from jobs import services
from jobs.choices import ReasonCode, WorkloadKind, WorkloadState
from jobs.models import Allocation, LaunchPreset, LogChunk, Replica, ReplicaState, Workload, WorkloadEvent
from jobs.scheduler import shell
from jobs.services.execution import container_name
from tenants.context import Actor
from tenants.models import AuditEvent, Membership, Project, ProjectQuota
from tests.conftest import PASSWORD, World
from tests.frontend.test_pages import logged_in
from tests.inventory.factories import make_node
from tests.jobs.factories import add_node, assign, give_quota, request

LIST = "/t/tenant-a/workloads/"
LAUNCH = "/t/tenant-a/launch/"


def detail(workload: Workload) -> str:
    return f"/t/tenant-a/workloads/{workload.pk}/"


@pytest.fixture
def team(world: World) -> World:
    """Alpha can run work (an 8-GPU quota, one ready 8-GPU node); member_a and another member, other_a, are on it."""
    give_quota(world)
    make_node(Actor(user=world.operator), world.pool, name="n1", gpus=8, cpu_cores=64, memory_mib=512_000)
    assign(world.member_a, world.project_a)
    other = User.objects.create_user("other_a", "other_a@example.com", PASSWORD)
    Membership.all_tenants.create(tenant=world.tenant_a, user=other, role="member")
    assign(other, world.project_a)
    return world


def _submit(world: World, user: User | None = None, **overrides: Any) -> Workload:
    return services.submit_workload(
        actor=Actor(user=user or world.member_a), project=world.project_a, data=request(world, **overrides)
    )


def _set(workload: Workload, **fields: Any) -> Workload:
    """Put `workload` in a state the controller would have moved it to (no agent runs in these tests)."""
    Workload.all_tenants.filter(pk=workload.pk).update(**fields)
    return Workload.all_tenants.get(pk=workload.pk)


def _row(page: str, workload: Workload) -> str:
    return page.split(f'data-workload="{workload.pk}"')[1].split("</tr>")[0]


def _launch_form(world: World, **overrides: Any) -> dict[str, Any]:
    return {
        "kind": "job",
        "name": "train",
        "project": "alpha",
        "pool": world.pool.name,
        "image": "registry.example.com/team/train:1.0",
        "command": "python train.py --note 'two words'",
        "gpus_per_replica": 2,
        "replicas": 1,
        "cpu_milli": 2000,
        "memory_mib": 8192,
        "priority_class": "normal",
        "max_runtime_seconds": "",
        "env": "EPOCHS=3\nWANDB_MODE=offline\n",
        **overrides,
    }


def _field_error(page: str, field: str) -> str:
    """Return the error shown next to `field`, or '' when there is none."""
    marker = f'data-field="{field}"'
    return page.split(marker)[1].split("</small>")[0] if marker in page else ""


# The list


def test_every_persona_of_the_tenant_sees_the_list_newest_first(team: World) -> None:
    first, second = _submit(team, name="first"), _submit(team, name="second")
    for username in ("member_a", "other_a", "viewer_a", "admin_a"):
        page = logged_in(username).get(LIST).content.decode()
        assert page.index(f'data-workload="{second.pk}"') < page.index(f'data-workload="{first.pk}"')
        row = _row(page, first)
        assert f'href="{detail(first)}"' in row and "alpha" in row and "member_a" in row and "Pending" in row


def test_another_tenant_gets_not_found_on_every_workload_page(team: World) -> None:
    workload = _submit(team)
    client = logged_in("admin_b")
    for path in (LIST, LAUNCH, detail(workload)):
        assert client.get(path).status_code == 404
    assert client.post(detail(workload), {"action": "cancel"}).status_code == 404
    # Nor does its own tenant's address reach tenant A's workload.
    assert client.get(f"/t/tenant-b/workloads/{workload.pk}/").status_code == 404
    assert Workload.all_tenants.get(pk=workload.pk).state == WorkloadState.PENDING


def test_anonymous_visitors_are_sent_to_log_in(team: World) -> None:
    workload = _submit(team)
    for path in (LIST, LAUNCH, detail(workload)):
        response = Client().get(path)
        assert response.status_code == 302 and response["Location"].startswith("/login/?next="), path
    assert Client().post(detail(workload), {"action": "cancel"}).status_code == 302
    assert Workload.all_tenants.get(pk=workload.pk).state == WorkloadState.PENDING


def test_pending_rows_say_why_they_wait_and_where_they_stand(team: World) -> None:
    _set(_submit(team, name="big", gpus_per_replica=8), state=WorkloadState.RUNNING)
    waiting = _submit(team, name="later")
    fresh = _submit(team, name="fresh")
    _set(
        waiting,
        reason_code=ReasonCode.QUOTA_LIMIT,
        reason_message="Project alpha already uses 8 of its limit of 8 GPUs.",
        queue_position=1,
    )
    page = logged_in("viewer_a").get(LIST).content.decode()
    row = _row(page, waiting)
    assert "QUOTA_LIMIT" in row and "already uses 8 of its limit" in row and "#1 in shared" in row
    assert "not looked at yet" in _row(page, fresh)


def test_the_list_filters_by_state_project_kind_and_mine(team: World) -> None:
    mine = _submit(team, name="mine")
    theirs = _submit(team, user=User.objects.get(username="other_a"), name="theirs")
    notebook = _submit(team, name="nb", kind=WorkloadKind.NOTEBOOK)
    _set(theirs, state=WorkloadState.FAILED)
    other_project = Project.all_tenants.create(tenant=team.tenant_a, slug="gamma", name="Gamma")
    give_quota(team, other_project)
    elsewhere = services.submit_workload(
        actor=Actor(user=team.admin_a), project=other_project, data=request(team, name="elsewhere")
    )
    client = logged_in("member_a")

    def listed(query: str) -> set[int]:
        page = client.get(f"{LIST}?{query}").content.decode()
        return {w.pk for w in (mine, theirs, notebook, elsewhere) if f'data-workload="{w.pk}"' in page}

    assert listed("") == {mine.pk, theirs.pk, notebook.pk, elsewhere.pk}
    assert listed("state=failed") == {theirs.pk}
    assert listed("project=gamma") == {elsewhere.pk}
    assert listed("kind=notebook") == {notebook.pk}
    assert listed("mine=on") == {mine.pk, notebook.pk}
    assert listed("mine=on&state=pending&kind=job&project=alpha") == {mine.pk}
    # A filter the form does not offer narrows nothing rather than failing.
    assert listed("state=sleeping") == {mine.pk, theirs.pk, notebook.pk, elsewhere.pk}


def test_the_list_is_paginated(team: World) -> None:
    for i in range(55):
        _submit(team, name=f"w{i}")
    client = logged_in("member_a")
    first = client.get(LIST).content.decode()
    assert first.count("data-workload=") == 50 and "Page 1 of 2" in first
    assert client.get(f"{LIST}?page=2").content.decode().count("data-workload=") == 5


def test_only_the_owner_and_tenant_admins_are_offered_a_running_notebook(team: World) -> None:
    notebook = _set(_submit(team, name="nb", kind=WorkloadKind.NOTEBOOK), state=WorkloadState.RUNNING)
    pending = _submit(team, name="nb2", kind=WorkloadKind.NOTEBOOK)
    lab = f"/notebooks/{notebook.pk}/open"
    for username, offered in (("member_a", True), ("admin_a", True), ("other_a", False), ("viewer_a", False)):
        client = logged_in(username)
        page = client.get(LIST).content.decode()
        assert (lab in _row(page, notebook)) is offered, username
        assert "Open notebook" not in _row(page, pending)
        assert (lab in client.get(detail(notebook)).content.decode()) is offered, username


# Launching


def test_a_member_launches_a_job_and_lands_on_its_page(team: World) -> None:
    client = logged_in("member_a")
    response = client.post(LAUNCH, _launch_form(team))
    workload = Workload.all_tenants.get(name="train")
    assert response.status_code == 302 and response["Location"] == detail(workload)
    assert workload.owner == team.member_a and workload.project == team.project_a
    assert workload.command == ["python", "train.py", "--note", "two words"]
    assert workload.env == {"EPOCHS": "3", "WANDB_MODE": "offline"}
    assert (workload.gpus_per_replica, workload.cpu_milli, workload.memory_mib) == (2, 2000, 8192)
    page = client.get(detail(workload)).content.decode()
    assert "Workload train submitted." in page and "Pending" in page


def test_the_same_form_sent_twice_launches_once(team: World) -> None:
    client = logged_in("member_a")
    form = _launch_form(team, idempotency_key="k-123")
    first, second = client.post(LAUNCH, form), client.post(LAUNCH, form)
    assert first["Location"] == second["Location"]
    assert Workload.all_tenants.count() == 1


@pytest.mark.parametrize(
    ("overrides", "field", "says"),
    [
        ({"name": "Not_A_Name"}, "name", "lowercase letters, digits or hyphens"),
        ({"image": "UPPER/case"}, "image", "Must be an image reference"),
        ({"gpus_per_replica": 65}, "gpus_per_replica", "Must be between 0 and 64."),
        ({"gpus_per_replica": "two"}, "gpus_per_replica", "Must be a whole number."),
        ({"gpus_per_replica": 9}, "gpus_per_replica", "9 GPUs exceed project alpha&#x27;s limit of 8"),
        ({"replicas": 0}, "replicas", "Must be between 1 and 64."),
        ({"max_runtime_seconds": 5}, "max_runtime_seconds", "Must be between 60 and"),
        ({"env": "LD_PRELOAD=/x.so"}, "env", "env.LD_PRELOAD refused (forbidden_env)"),
        ({"env": "just words"}, "env", "Line 1: write KEY=VALUE."),
        ({"command": "python -c 'unclosed"}, "command", "Cannot split the command"),
        ({"pool": "nowhere"}, "pool", "Select a valid choice"),
    ],
)
def test_bad_input_shows_the_rule_next_to_its_field_and_writes_nothing(
    team: World, overrides: dict[str, Any], field: str, says: str
) -> None:
    audit_before = AuditEvent.all_tenants.count()
    response = logged_in("member_a").post(LAUNCH, _launch_form(team, **overrides))
    assert response.status_code == 400
    page = response.content.decode()
    assert says in _field_error(page, field)
    # The form comes back as it was sent, ready to correct.
    kept = {"command", "env", "image"} - {field}
    assert all(f'name="{name}"' in page for name in kept)
    if "image" in kept:
        assert 'value="registry.example.com/team/train:1.0"' in page
    if "env" in kept:
        assert "EPOCHS=3\nWANDB_MODE=offline\n</textarea>" in page
    assert not Workload.all_tenants.exists()
    assert AuditEvent.all_tenants.count() == audit_before


def test_a_preset_fills_the_form_and_the_launch_keeps_it(team: World) -> None:
    preset = LaunchPreset.all_tenants.create(
        tenant=team.tenant_a,
        name="PyTorch notebook",
        description="One H100 and JupyterLab.",
        kind=WorkloadKind.NOTEBOOK,
        image="registry.example.com/team/lab:2",
        pool=team.pool,
        gpus_per_replica=1,
        memory_mib=16384,
        shm_mib=8192,
        idle_timeout_seconds=1800,
    )
    LaunchPreset.all_tenants.create(tenant=team.tenant_b, name="theirs", image="x.example.com/y:1", pool=team.pool)
    client = logged_in("member_a")
    page = client.get(LAUNCH).content.decode()
    assert f'data-preset="{preset.pk}"' in page and "One H100 and JupyterLab." in page and "theirs" not in page
    filled = client.get(f"{LAUNCH}?preset={preset.pk}").content.decode()
    assert 'value="pytorch-notebook"' in filled and 'value="16384"' in filled and 'value="8192"' in filled
    assert '<option value="notebook" selected>' in filled
    form = _launch_form(team, kind="notebook", name="pytorch-notebook", image=preset.image, command="", env="")
    # A /dev/shm over the memory is named on its field, which the member can change.
    response = client.post(LAUNCH, {**form, "preset": preset.pk, "memory_mib": 4096, "shm_mib": 8192})
    assert response.status_code == 400 and "Must be at most memory_mib (4096 MiB)." in response.content.decode()
    response = client.post(LAUNCH, {**form, "preset": preset.pk, "memory_mib": 16384, "shm_mib": 8192})
    assert response.status_code == 302
    launched = Workload.all_tenants.get(name="pytorch-notebook")
    assert (launched.preset_id, launched.idle_timeout_seconds, launched.memory_mib) == (preset.pk, 1800, 16384)
    assert launched.shm_mib == 8192
    page = client.get(f"{LIST}{launched.pk}/").content.decode()
    assert '<th scope="row">Shared memory</th><td>8 GiB per replica</td>' in page
    presets = logged_in("admin_a").get("/t/tenant-a/presets/").content.decode()
    assert "16384 MiB (shm 8192 MiB)" in presets
    # Another tenant's preset, or one deleted meanwhile, is refused on the page, not launched.
    response = client.post(LAUNCH, {**form, "name": "again", "preset": 999_999})
    assert response.status_code == 400 and "That launch preset is gone" in response.content.decode()
    assert not Workload.all_tenants.filter(name="again").exists()


def test_a_member_may_launch_only_into_their_projects(team: World) -> None:
    Project.all_tenants.create(tenant=team.tenant_a, slug="gamma", name="Gamma")
    page = logged_in("member_a").get(LAUNCH).content.decode()
    assert 'value="alpha"' in page and 'value="gamma"' not in page
    response = logged_in("member_a").post(LAUNCH, _launch_form(team, project="gamma"))
    assert "Select a valid choice" in _field_error(response.content.decode(), "project")
    assert 'value="gamma"' in logged_in("admin_a").get(LAUNCH).content.decode()
    assert not Workload.all_tenants.exists()


def test_viewers_cannot_launch(team: World) -> None:
    client = logged_in("viewer_a")
    assert f'href="{LAUNCH}"' not in client.get(LIST).content.decode()
    assert client.get(LAUNCH).status_code == 403
    assert client.post(LAUNCH, _launch_form(team)).status_code == 403
    assert not Workload.all_tenants.exists()


# One workload's page


def test_the_page_shows_why_it_waits_its_timeline_and_where_it_runs(team: World) -> None:
    ProjectQuota.all_tenants.filter(project=team.project_a, pool=team.pool).update(limit=2)
    placed, waiting = _submit(team, name="big", gpus_per_replica=2), _submit(team, name="later")
    assert shell.run_pass() is not None
    page = logged_in("viewer_a").get(detail(waiting)).content.decode()
    why = page.split('id="why-pending"')[1].split("</article>")[0]
    assert "position 1" in why and "QUOTA_LIMIT" in why and "limit of 2" in why
    page = logged_in("viewer_a").get(detail(placed)).content.decode()
    allocations = page.split('id="allocations"')[1].split("</table>")[0]
    assert allocations.count("<code>n1</code>") == 2 and "NVIDIA H100" in allocations
    timeline = " ".join(page.split('id="timeline"')[1].split("</table>")[0].split())
    assert "Submitted by member_a" in timeline and "Pending → Scheduled" in timeline


def _store_log(world: World, workload: Workload, *, lines: int, attempt: int = 1) -> None:
    """Store `lines` numbered output lines of replica 0 in chunks of 50, as log ingestion would."""
    now = timezone.now()
    for start in range(1, lines + 1, 50):
        LogChunk.all_tenants.create(
            tenant=world.tenant_a,
            workload=workload,
            first_seq=start,
            last_seq=start + 49,
            first_at=now,
            last_at=now,
            lines=[[seq, now.isoformat(), "stdout", f"line {seq}", attempt, 0] for seq in range(start, start + 50)],
        )


def test_the_page_shows_the_replicas_of_the_current_attempt_and_the_log_tail(team: World) -> None:
    workload = _set(_submit(team), state=WorkloadState.RUNNING, attempt=2, log_seq=250)
    node = add_node(team, "n2", gpus=0)
    for attempt, exit_code in ((1, 137), (2, None)):
        Replica.all_tenants.create(
            tenant=team.tenant_a,
            workload=workload,
            attempt=attempt,
            index=0,
            node=node,
            name=container_name(workload.pk, 0, attempt),
            state=ReplicaState.EXITED if exit_code else ReplicaState.RUNNING,
            exit_code=exit_code,
        )
    _store_log(team, workload, lines=250, attempt=2)
    page = logged_in("member_a").get(detail(workload)).content.decode()
    replicas = page.split('id="replicas"')[1].split("</table>")[0]
    assert "<code>n2</code>" in replicas and "Running" in replicas and "137" not in replicas
    log = page.split('id="log"')[1].split("</section>")[0]
    assert "line 51<" in log and "line 250<" in log and "line 50<" not in log
    assert log.count('class="log-line') == 200
    assert f"/api/v1/tenants/tenant-a/workloads/{workload.pk}/logs/download/" in log


def _actions(client: Client, workload: Workload) -> set[str]:
    page = client.get(detail(workload)).content.decode()
    return {name for name in ("cancel", "stop", "restart", "extend") if f'id="action-{name}"' in page}


def test_actions_are_offered_to_the_owner_and_admins_only_and_fit_the_state(team: World) -> None:
    pending = _submit(team, name="pending")
    running = _set(_submit(team, name="running"), state=WorkloadState.RUNNING)
    ended = _set(_submit(team, name="ended"), state=WorkloadState.FAILED)
    offered = {"pending": {"cancel"}, "running": {"stop"}, "ended": {"restart"}}
    for username, acts in (("member_a", True), ("admin_a", True), ("other_a", False), ("viewer_a", False)):
        client = logged_in(username)
        for workload in (pending, running, ended):
            assert _actions(client, workload) == (offered[workload.name] if acts else set()), (username, workload)


def test_the_owner_cancels_a_pending_workload_from_its_page(team: World) -> None:
    workload = _submit(team)
    client = logged_in("member_a")
    response = client.post(detail(workload), {"action": "cancel"})
    assert response.status_code == 302 and response["Location"] == detail(workload)
    assert Workload.all_tenants.get(pk=workload.pk).state == WorkloadState.CANCELLED
    page = client.get(detail(workload)).content.decode()
    assert "Workload train cancelled." in page and "CANCELLED_BY_USER" in page
    assert AuditEvent.all_tenants.filter(action="workload.cancel", object_id=str(workload.pk)).count() == 1


def test_a_tenant_admin_stops_a_members_running_workload(team: World) -> None:
    workload = _set(_submit(team), state=WorkloadState.RUNNING)
    response = logged_in("admin_a").post(detail(workload), {"action": "stop"})
    assert response.status_code == 302
    stopped = Workload.all_tenants.get(pk=workload.pk)
    assert (stopped.state, stopped.reason_code) == (WorkloadState.CANCELLED, ReasonCode.STOPPED_BY_USER)


@pytest.mark.parametrize("username", ["other_a", "viewer_a"])
def test_others_cannot_act_by_posting_and_see_why(team: World, username: str) -> None:
    workload = _submit(team)
    response = logged_in(username).post(detail(workload), {"action": "cancel"})
    assert response.status_code == 403
    assert 'id="refusal"' in response.content.decode()
    assert Workload.all_tenants.get(pk=workload.pk).state == WorkloadState.PENDING


def test_acting_on_a_stale_page_shows_the_conflict_not_an_error(team: World) -> None:
    workload = _set(_submit(team), state=WorkloadState.SUCCEEDED)
    response = logged_in("member_a").post(detail(workload), {"action": "cancel"})
    assert response.status_code == 409
    refusal = response.content.decode().split('id="refusal"')[1].split("</div>")[0]
    assert "only unfinished workloads can be cancelled" in refusal and "succeeded" in refusal
    assert logged_in("member_a").post(detail(workload), {"action": "launch-rockets"}).status_code == 400


def test_the_owner_restarts_an_ended_workload_as_a_new_attempt(team: World) -> None:
    workload = _submit(team)
    services.cancel_workload(actor=Actor(user=team.member_a), workload=workload)
    response = logged_in("member_a").post(detail(workload), {"action": "restart"})
    assert response.status_code == 302
    restarted = Workload.all_tenants.get(pk=workload.pk)
    assert (restarted.state, restarted.attempt) == (WorkloadState.PENDING, 2)
    timeline = logged_in("member_a").get(detail(workload)).content.decode().split('id="timeline"')[1]
    assert "Cancelled → Pending" in timeline and "RESTARTED" in timeline


def test_an_idle_notebook_offers_extend_to_its_owner(team: World) -> None:
    notebook = _set(
        _submit(team, kind=WorkloadKind.NOTEBOOK),
        state=WorkloadState.RUNNING,
        idle_warned_at=timezone.now() - timedelta(minutes=5),
    )
    assert _actions(logged_in("member_a"), notebook) == {"stop", "extend"}
    assert _actions(logged_in("viewer_a"), notebook) == set()
    response = logged_in("member_a").post(detail(notebook), {"action": "extend"})
    assert response.status_code == 302
    assert Workload.all_tenants.get(pk=notebook.pk).idle_extended_at is not None
    assert _actions(logged_in("member_a"), notebook) == {"stop"}


def _idle_warning(client: Client, workload: Workload) -> str:
    page = client.get(detail(workload)).content.decode()
    return page.split('id="idle-warning"')[1].split("</div>")[0] if 'id="idle-warning"' in page else ""


def test_the_idle_warning_offers_keep_it_running_and_hibernate_now_and_hibernate_frees_the_notebook(
    team: World,
) -> None:
    notebook = _set(
        _submit(team, kind=WorkloadKind.NOTEBOOK),
        state=WorkloadState.RUNNING,
        idle_warned_at=timezone.now() - timedelta(minutes=5),
    )
    warning = _idle_warning(logged_in("member_a"), notebook)
    assert 'id="idle-extend"' in warning and "Keep it running" in warning
    assert 'id="idle-hibernate"' in warning and "Hibernate now" in warning
    viewer_warning = _idle_warning(logged_in("viewer_a"), notebook)
    assert viewer_warning and "<form" not in viewer_warning, "a viewer reads the warning but acts on nothing"
    assert logged_in("member_a").post(detail(notebook), {"action": "hibernate"}).status_code == 302
    hibernated = Workload.all_tenants.get(pk=notebook.pk)
    assert (hibernated.state, hibernated.reason_code) == (WorkloadState.HIBERNATED, ReasonCode.HIBERNATED_BY_USER)
    assert not _idle_warning(logged_in("member_a"), notebook)


def test_the_tenants_start_page_brings_the_idle_warning_and_resume_to_the_notebooks_owner(team: World) -> None:
    warned = _set(
        _submit(team, name="warned", kind=WorkloadKind.NOTEBOOK),
        state=WorkloadState.RUNNING,
        idle_warned_at=timezone.now() - timedelta(minutes=5),
    )
    asleep = _set(_submit(team, name="asleep", kind=WorkloadKind.NOTEBOOK), state=WorkloadState.HIBERNATED)
    _set(asleep, lab_path="experiments/run.ipynb")
    _set(_submit(team, name="busy", kind=WorkloadKind.NOTEBOOK), state=WorkloadState.RUNNING)
    _set(_submit(team, user=team.admin_a, name="admins", kind=WorkloadKind.NOTEBOOK), state=WorkloadState.HIBERNATED)
    page = logged_in("member_a").get("/t/tenant-a/").content.decode()
    section = page.split('id="notebooks-awaiting"')[1].split("</section>")[0]
    rows = {row.split('"')[0]: row for row in section.split('data-workload="')[1:]}
    assert set(rows) == {str(warned.pk), str(asleep.pk)}, "only the viewer's own notebooks that ask something"
    assert 'value="extend"' in rows[str(warned.pk)] and 'value="hibernate"' in rows[str(warned.pk)]
    assert 'value="resume"' in rows[str(asleep.pk)] and "experiments/run.ipynb" in rows[str(asleep.pk)]
    assert f'action="{detail(asleep)}"' in rows[str(asleep.pk)]
    # Resume from the start page queues the same notebook again and lands on its page.
    response = logged_in("member_a").post(detail(asleep), {"action": "resume"})
    assert response.status_code == 302 and response["Location"] == detail(asleep)
    assert Workload.all_tenants.get(pk=asleep.pk).state == WorkloadState.PENDING
    assert 'id="notebooks-awaiting"' not in logged_in("viewer_a").get("/t/tenant-a/").content.decode()
    assert 'id="notebooks-awaiting"' not in logged_in("admin_b").get("/t/tenant-b/").content.decode()


# Query counts


def test_the_list_page_uses_a_bounded_number_of_queries(team: World, django_assert_max_num_queries: Any) -> None:
    for i in range(30):
        workload = _submit(team, name=f"w{i}", kind=WorkloadKind.NOTEBOOK if i % 2 else WorkloadKind.JOB)
        if i % 3 == 0:
            _set(workload, state=WorkloadState.RUNNING)
    client = logged_in("member_a")
    with django_assert_max_num_queries(8):
        assert client.get(LIST).content.decode().count("data-workload=") == 30


def test_the_detail_page_uses_a_bounded_number_of_queries(team: World, django_assert_max_num_queries: Any) -> None:
    placed = _submit(team, name="big", gpus_per_replica=4, replicas=2)
    shell.run_pass()
    for i in range(20):
        WorkloadEvent.all_tenants.create(tenant=team.tenant_a, workload=placed, kind=f"workload.note{i}")
    assert Allocation.all_tenants.filter(workload=placed).count() == 8
    _store_log(team, _set(placed, log_seq=600), lines=600)
    client = logged_in("member_a")
    with django_assert_max_num_queries(10):
        page = client.get(detail(placed)).content.decode()
    assert page.count("<code>n1</code>") >= 8 and page.count('class="log-line') == 200
