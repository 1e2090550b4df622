"""jobs.sql against the ORM: each read returns, each write leaves, what the equivalent queryset does.

Rows are generated (hypothesis) over the persona world's two tenants and
one pool, plus what each example adds; the project quota lock, and the log
chain's statement (Postgres only), are checked on Postgres.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from functools import reduce
from operator import or_
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, connection, transaction
from django.db.models import Count, Exists, Q, Subquery
from django.db.models.expressions import OuterRef
from hypothesis import given
from hypothesis import strategies as st

from inventory.choices import GpuHealth, NodeState
from inventory.models import Gpu, Node, NodePool
from jobs import sql
from jobs.choices import WorkloadKind, WorkloadState
from jobs.models import AllowedImage, LogChunk, Replica, Workload, WorkloadEvent
from tenants.choices import Role
from tenants.models import Membership, Project, ProjectQuota, Tenant, TenantQuota
from tests.conftest import World
from tests.examples import SQL_EXAMPLES, counts, effect, moments, rolled_back, texts
from tests.jobs.factories import give_quota

pytestmark = pytest.mark.django_db

STATES = [state.value for state in WorkloadState]
# An id no row has.
NOBODY = 10**9


def _pools(world: World, names: list[str]) -> list[NodePool]:
    return [world.pool, *(NodePool.objects.create(name=f"q{i}-{name}") for i, name in enumerate(names))]


def _projects(world: World, count: int) -> list[Project]:
    tenants = [world.tenant_a, world.tenant_b]
    made = [Project.all_tenants.create(tenant=tenants[i % 2], slug=f"x{i}", name="x") for i in range(count)]
    return [world.project_a, world.project_b, *made]


def _orm_rows(found: Any) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(row) for row in found)


# --- allowed images -------------------------------------------------------------------------


@SQL_EXAMPLES
@given(
    made=st.lists(st.tuples(st.none() | st.integers(0, 1), texts, st.booleans()), unique_by=lambda i: i[:2]),
    asked=st.sets(st.sampled_from([0, 1, NOBODY]), min_size=1),
)
def test_allowed_image_rows(world: World, made: list[tuple[int | None, str, bool]], asked: set[int]) -> None:
    tenants = [world.tenant_a.pk, world.tenant_b.pk]
    ids = sorted(tenants[i] if i < 2 else i for i in asked)
    with rolled_back():
        AllowedImage.objects.bulk_create(
            AllowedImage(tenant_id=None if t is None else tenants[t], pattern=p, notebook=n) for t, p, n in made
        )
        first = AllowedImage.objects.order_by("pk").values("pk")[:1]
        expected = AllowedImage.objects.filter(Q(tenant_id__in=ids) | Q(tenant__isnull=True) | Q(pk=Subquery(first)))
        rows = sql.allowed_image_rows(ids)
        assert Counter(rows) == _orm_rows(expected.values_list("tenant_id", "pattern", "notebook"))
        assert all(type(notebook) is bool for _, _, notebook in rows)


# --- quota limits ---------------------------------------------------------------------------

limits = st.fixed_dictionaries({name: st.none() | counts for name in sql.LIMIT_FIELDS})


@SQL_EXAMPLES
@given(
    tenant_quotas=st.lists(st.none() | limits, min_size=4, max_size=4),
    project_quotas=st.lists(st.none() | st.tuples(counts, limits), min_size=8, max_size=8),
    asked=st.sets(st.tuples(st.integers(0, 4), st.integers(0, 1)), min_size=1),
    lock=st.booleans(),
)
def test_quota_limits(
    world: World,
    tenant_quotas: list[dict[str, int | None] | None],
    project_quotas: list[tuple[int, dict[str, int | None]] | None],
    asked: set[tuple[int, int]],
    lock: bool,
) -> None:
    with rolled_back():
        TenantQuota.all_tenants.all().delete()
        pools = _pools(world, ["p"])
        projects = _projects(world, 2)
        for index, values in enumerate(tenant_quotas):
            if values is not None:
                tenant = (world.tenant_a, world.tenant_b)[index // 2]
                TenantQuota.all_tenants.create(tenant=tenant, pool=pools[index % 2], limit=0, **values)
        for index, quota in enumerate(project_quotas):
            if quota is not None:
                project, (limit, values) = projects[index // 2], quota
                ProjectQuota.all_tenants.create(
                    tenant_id=project.tenant_id, project=project, pool=pools[index % 2], limit=limit, **values
                )
        # Project index 4 has no row at all.
        keys = sorted({(projects[p].pk if p < 4 else NOBODY, pools[q].pk) for p, q in asked})
        found = sql.quota_limits(keys, lock=lock)
        tenant_quota = TenantQuota.all_tenants.filter(tenant_id=OuterRef("tenant_id"), pool_id=OuterRef("pool_id"))
        expected = (
            ProjectQuota.all_tenants.filter(reduce(or_, (Q(project_id=p, pool_id=q) for p, q in keys)))
            .annotate(**{f"tenant_{name}": Subquery(tenant_quota.values(name)) for name in sql.LIMIT_FIELDS})
            .order_by("project_id", "pool_id")
            .values_list(
                "project_id", "pool_id", "limit", *sql.LIMIT_FIELDS, *(f"tenant_{n}" for n in sql.LIMIT_FIELDS)
            )
        )
        assert [tuple(row) for row in found] == list(expected)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("lock", [True, False])
def test_quota_limits_lock_the_project_quota_rows_only(world: World, lock: bool) -> None:
    """With `lock`, another transaction cannot lock the project's quota row until this one ends; it can
    always lock the tenant's, which is only read."""
    quota = give_quota(world)
    outcomes: dict[str, str] = {}

    def try_locks() -> None:
        try:
            for name, rows in (
                ("project", ProjectQuota.all_tenants.filter(pk=quota.pk)),
                ("tenant", TenantQuota.all_tenants.filter(pk=world.quota_a.pk)),
            ):
                try:
                    with transaction.atomic():
                        list(rows.select_for_update(nowait=True))
                    outcomes[name] = "free"
                except DatabaseError:
                    outcomes[name] = "locked"
        finally:
            connection.close()

    with transaction.atomic():
        assert len(sql.quota_limits([(world.project_a.pk, world.pool.pk)], lock=lock)) == 1
        other = threading.Thread(target=try_locks)
        other.start()
        other.join(timeout=30)
    assert outcomes == {"project": "locked" if lock else "free", "tenant": "free"}


# --- GPUs by node ---------------------------------------------------------------------------

gpus = st.lists(
    st.tuples(st.booleans(), st.sampled_from([h.value for h in GpuHealth]), st.sampled_from(["A100", "H100", ""])),
    max_size=4,
)


@SQL_EXAMPLES
@given(
    nodes=st.lists(st.tuples(st.integers(0, 2), st.sampled_from([s.value for s in NodeState]), gpus), max_size=6),
    asked=st.sets(st.integers(0, 3), min_size=1),
    gone=st.sets(st.sampled_from([s.value for s in NodeState]), min_size=1),
)
def test_gpu_counts(
    world: World, nodes: list[tuple[int, str, list[tuple[bool, str, str]]]], asked: set[int], gone: set[str]
) -> None:
    with rolled_back():
        pools = _pools(world, ["p", "q"])
        for index, (pool, state, made) in enumerate(nodes):
            node = Node.objects.create(name=f"n{index}", pool=pools[pool], state=state)
            Gpu.objects.bulk_create(
                Gpu(node=node, index=i, uuid=f"G{index}-{i}", present=present, health=health, model=model)
                for i, (present, health, model) in enumerate(made)
            )
        # Pool index 3 does not exist.
        pool_ids = sorted(pools[i].pk if i < 3 else NOBODY for i in asked)
        states = sorted(gone)
        found = sql.gpu_counts(pool_ids, failed=GpuHealth.FAILED.value, gone_node_states=states)
        expected = (
            Gpu.objects.filter(present=True, node__pool_id__in=pool_ids)
            .exclude(health=GpuHealth.FAILED)
            .exclude(node__state__in=states)
            .values_list("node__pool_id", "node_id", "model")
            .annotate(count=Count("*"))
            .order_by()
        )
        assert Counter(tuple(row) for row in found) == _orm_rows(expected)


# --- workload counts ------------------------------------------------------------------------

workloads = st.lists(
    st.tuples(
        st.integers(0, 2),  # project
        st.integers(0, 1),  # owner
        st.integers(0, 1),  # pool
        st.sampled_from([k.value for k in WorkloadKind]),
        st.sampled_from(STATES),
    ),
    max_size=12,
)


def _workloads(world: World, made: list[tuple[int, int, int, str, str]]) -> tuple[list[Project], list[NodePool]]:
    pools = _pools(world, ["p"])
    projects = _projects(world, 1)
    owners = [world.member_a, world.admin_b]
    Workload.all_tenants.bulk_create(
        Workload(
            tenant_id=projects[project].tenant_id,
            project=projects[project],
            owner=owners[owner],
            pool=pools[pool],
            kind=kind,
            state=state,
            name="w",
            image="i",
        )
        for project, owner, pool, kind, state in made
    )
    return projects, pools


@SQL_EXAMPLES
@given(made=workloads, asked=st.sets(st.tuples(st.integers(0, 2), st.integers(0, 1)), min_size=1))
def test_pending_counts(world: World, made: list[tuple[int, int, int, str, str]], asked: set[tuple[int, int]]) -> None:
    with rolled_back():
        projects, pools = _workloads(world, made)
        keys = {(projects[p].pk, pools[q].pk) for p, q in asked}
        expected = (
            Workload.all_tenants.filter(state=WorkloadState.PENDING)
            .filter(reduce(or_, (Q(project_id=p, pool_id=q) for p, q in keys)))
            .values_list("project_id", "pool_id")
            .annotate(count=Count("*"))
            .order_by()
        )
        found = sql.pending_counts(keys, pending=WorkloadState.PENDING.value)
        assert found == {(p, q): n for p, q, n in expected}


@SQL_EXAMPLES
@given(
    made=workloads,
    asked=st.sets(st.tuples(st.integers(0, 2), st.integers(0, 1), st.integers(0, 1)), min_size=1),
    states=st.sets(st.sampled_from(STATES), min_size=1),
)
def test_notebook_counts(
    world: World, made: list[tuple[int, int, int, str, str]], asked: set[tuple[int, int, int]], states: set[str]
) -> None:
    with rolled_back():
        projects, pools = _workloads(world, made)
        owners = [world.member_a, world.admin_b]
        keys = {(projects[p].pk, owners[o].pk, pools[q].pk) for p, o, q in asked}
        expected = (
            Workload.all_tenants.filter(kind=WorkloadKind.NOTEBOOK, state__in=states)
            .filter(reduce(or_, (Q(project_id=p, owner_id=o, pool_id=q) for p, o, q in keys)))
            .values_list("project_id", "owner_id", "pool_id")
            .annotate(count=Count("*"))
            .order_by()
        )
        found = sql.notebook_counts(keys, notebook=WorkloadKind.NOTEBOOK.value, states=sorted(states))
        assert found == {(p, o, q): n for p, o, q, n in expected}


# --- submitted events -----------------------------------------------------------------------


@SQL_EXAMPLES
@given(
    made=st.lists(st.tuples(st.integers(0, 64), st.integers(1, 64), st.integers(0, 1)), min_size=1, max_size=6),
    usernames=st.lists(texts, min_size=2, max_size=2),
    pool_name=texts,
    chosen=st.sets(st.integers(0, 5), min_size=1),
    now=moments,
)
def test_insert_submitted_events(
    world: World,
    made: list[tuple[int, int, int]],
    usernames: list[str],
    pool_name: str,
    chosen: set[int],
    now: datetime,
) -> None:
    with rolled_back():
        owners = [world.member_a, world.admin_b]
        for index, (owner, name) in enumerate(zip(owners, usernames, strict=True)):
            User.objects.filter(pk=owner.pk).update(username=f"{index}{name}")
        pool = NodePool.objects.create(name=f"p-{pool_name}")
        rows = Workload.all_tenants.bulk_create(
            Workload(
                tenant_id=(world.tenant_a, world.tenant_b)[owner].pk,
                project=(world.project_a, world.project_b)[owner],
                owner=owners[owner],
                pool=pool,
                gpus_per_replica=per_replica,
                replicas=replicas,
                name="w",
                image="i",
            )
            for per_replica, replicas, owner in made
        )
        # Unordered on purpose: the events follow the workloads' ids whatever the order asked.
        ids = [rows[i].pk for i in chosen if i < len(rows)] or [rows[0].pk]
        kind, to_state = "workload.submitted", WorkloadState.PENDING.value

        def by_orm() -> None:
            submitted = Workload.all_tenants.select_related("owner", "pool").filter(pk__in=ids).order_by("pk")
            WorkloadEvent.all_tenants.bulk_create(
                WorkloadEvent(
                    tenant_id=w.tenant_id,
                    workload=w,
                    kind=kind,
                    to_state=to_state,
                    message=f"Submitted by {w.owner.username}: {w.total_gpus} GPU(s) in pool {w.pool.name}.",
                    created_at=now,
                )
                for w in submitted
            )

        def events() -> list[tuple[Any, ...]]:
            written = WorkloadEvent.all_tenants.order_by("pk")
            fields = ("tenant_id", "workload_id", "kind", "from_state", "to_state", "reason_code", "message")
            return list(written.values_list(*fields, "created_at"))

        by_sql = effect(lambda: sql.insert_submitted_events(ids, kind=kind, to_state=to_state, created_at=now), events)
        assert by_sql == effect(by_orm, events)


# --- reasons --------------------------------------------------------------------------------


@SQL_EXAMPLES
@given(
    states=st.lists(st.sampled_from(STATES), min_size=1, max_size=6),
    reasons=st.lists(
        st.tuples(st.integers(0, 5), texts, texts, texts, st.none() | counts), unique_by=lambda r: r[0], max_size=6
    ),
)
def test_record_reasons(world: World, states: list[str], reasons: list[tuple[int, str, str, str, int | None]]) -> None:
    with rolled_back():
        rows = Workload.all_tenants.bulk_create(
            Workload(
                tenant_id=world.tenant_a.pk,
                project=world.project_a,
                owner=world.member_a,
                pool=world.pool,
                state=state,
                reason_code="OLD",
                queue_position=7,
                name="w",
                image="i",
            )
            for state in states
        )
        # Some rows name a workload that does not exist.
        given_rows = [(c, m, h, p, rows[i].pk if i < len(rows) else NOBODY) for i, c, m, h, p in reasons]

        def by_orm() -> None:
            for code, message, hint, position, workload_id in given_rows:
                Workload.all_tenants.filter(pk=workload_id, state=WorkloadState.PENDING).update(
                    reason_code=code, reason_message=message, reason_hint=hint, queue_position=position
                )

        def reasons_now() -> list[tuple[Any, ...]]:
            fields = ("pk", "state", "reason_code", "reason_message", "reason_hint", "queue_position")
            return list(Workload.all_tenants.order_by("pk").values_list(*fields))

        by_sql = effect(lambda: sql.record_reasons(given_rows, pending=WorkloadState.PENDING.value), reasons_now)
        assert by_sql == effect(by_orm, reasons_now)


# --- the notebook proxy's access read -------------------------------------------------------

# The first of each choice lets a user reach a notebook, so that hypothesis's simplest examples do.
ROLES = [Role.ADMIN.value, Role.MEMBER.value, Role.VIEWER.value]
yes_no = st.sampled_from([True, False])
SERVES = "http://10.0.0.1:8888"
# A notebook's replicas: the endpoint of replica 0 of its current attempt (None: no such replica), and
# whether replica 1 of that attempt and replica 0 of another attempt are there, serving.
replicas = st.tuples(st.sampled_from([SERVES, "", None]), yes_no)


def _workload(world: World, tenant: int, **fields: Any) -> Workload:
    """Create a workload of tenant A (0) or B (1) in its project and the shared pool, member_a's unless `fields` say."""
    project = (world.project_a, world.project_b)[tenant]
    made = {"owner": world.member_a, "name": "w", "image": "i"} | fields
    return Workload.all_tenants.create(tenant_id=project.tenant_id, project=project, pool=world.pool, **made)


def _orm_session(
    workload_id: int, user_id: int, *, live: set[str], owner_roles: set[str], admin: str
) -> list[tuple[str, str | None]]:
    members = Membership.all_tenants.filter(tenant_id=OuterRef("tenant_id"), user_id=user_id)
    endpoint = (
        Replica.all_tenants.filter(workload_id=OuterRef("pk"), attempt=OuterRef("attempt"), index=0)
        .exclude(endpoint="")
        .values("endpoint")[:1]
    )
    reaches = Q(Exists(members.filter(role__in=owner_roles)), owner_id=user_id) | Exists(members.filter(role=admin))
    found = (
        Workload.all_tenants.filter(pk=workload_id, kind=WorkloadKind.NOTEBOOK, state__in=live)
        .filter(reaches, tenant__is_active=True)
        .exclude(session_secret="")
        .values_list("session_secret", Subquery(endpoint))
    )
    return list(found)


@SQL_EXAMPLES
@given(
    notebooks=st.lists(
        st.tuples(
            st.integers(0, 1),  # tenant
            st.integers(0, 2),  # owner
            st.sampled_from([WorkloadKind.NOTEBOOK.value, WorkloadKind.JOB.value]),
            st.sampled_from(STATES),
            st.sampled_from(["s3cr3t", ""]),  # session secret
            st.integers(1, 2),  # attempt
            replicas,
        ),
        min_size=1,
        max_size=4,
    ),
    roles=st.lists(st.sampled_from(ROLES) | st.none(), min_size=6, max_size=6),
    active=st.tuples(yes_no, yes_no),
    live=st.sets(st.sampled_from(STATES), min_size=1),
    owner_roles=st.sets(st.sampled_from(ROLES), min_size=1),
    admin=st.sampled_from(ROLES),
)
def test_notebook_session(
    world: World,
    notebooks: list[tuple[int, int, str, str, str, int, tuple[str | None, bool]]],
    roles: list[str | None],
    active: tuple[bool, bool],
    live: set[str],
    owner_roles: set[str],
    admin: str,
) -> None:
    tenants = [world.tenant_a, world.tenant_b]
    users = [world.member_a, world.admin_b, world.operator]
    with rolled_back():
        Membership.all_tenants.all().delete()
        # roles[2 * user + tenant]: the user's role in that tenant, None for no membership.
        Membership.all_tenants.bulk_create(
            Membership(tenant=tenants[i % 2], user=users[i // 2], role=role) for i, role in enumerate(roles) if role
        )
        for row, is_active in zip(tenants, active, strict=True):
            Tenant.objects.filter(pk=row.pk).update(is_active=is_active)
        node = Node.objects.create(name="n", pool=world.pool)
        ids = [NOBODY]
        for tenant, owner, kind, state, secret, attempt, (endpoint, others) in notebooks:
            workload = _workload(
                world, tenant, owner=users[owner], kind=kind, state=state, session_secret=secret, attempt=attempt
            )
            ids.append(workload.pk)
            made = [(attempt, 0, endpoint)] if endpoint is not None else []
            made += [(attempt, 1, SERVES), (attempt + 1, 0, SERVES)] if others else []
            Replica.all_tenants.bulk_create(
                Replica(tenant=tenants[tenant], workload=workload, attempt=a, index=i, node=node, name="r", endpoint=e)
                for a, i, e in made
            )
        for workload_id in ids:
            for user in users:
                expected = _orm_session(workload_id, user.pk, live=live, owner_roles=owner_roles, admin=admin)
                found = sql.notebook_session(
                    workload_id,
                    user.pk,
                    notebook=WorkloadKind.NOTEBOOK.value,
                    live=sorted(live),
                    owner_roles=sorted(owner_roles),
                    admin=admin,
                )
                assert ([] if found is None else [found]) == expected, (workload_id, user.username)


# --- the log chain's one statement ----------------------------------------------------------

lines = st.lists(st.tuples(texts, st.sampled_from(["stdout", "stderr"]), texts), min_size=1, max_size=5)


@pytest.mark.postgres
@SQL_EXAMPLES
@given(
    cursors=st.lists(texts, min_size=3, max_size=3),
    log_seq=st.integers(0, 2**53),
    asked=st.tuples(st.integers(0, 3), st.booleans()),  # the replica (3: none), and whether `since` is its cursor
    since=texts,
    cursor=texts,
    batch=lines,
    first_at=moments,
    last_at=moments,
    size=counts,
)
def test_continue_log_chain(
    world: World,
    cursors: list[str],
    log_seq: int,
    asked: tuple[int, bool],
    since: str,
    cursor: str,
    batch: list[tuple[str, str, str]],
    first_at: datetime,
    last_at: datetime,
    size: int,
) -> None:
    with rolled_back():
        node = Node.objects.create(name="n", pool=world.pool)
        workloads = [_workload(world, tenant, log_seq=log_seq) for tenant in (0, 1)]
        # Replicas 0 and 1 of the first workload's attempt 1; replica 2 is the second workload's, which
        # must not move when the first's chain does.
        made = Replica.all_tenants.bulk_create(
            Replica(
                tenant_id=workloads[i // 2].tenant_id,
                workload=workloads[i // 2],
                attempt=1,
                index=i % 2,
                node=node,
                name=f"r{i}",
                log_cursor=text,
            )
            for i, text in enumerate(cursors)
        )
        replica, continues = asked
        target = made[replica] if replica < 3 else None
        key = (workloads[0].pk, 1, replica) if target is None else (target.workload_id, target.attempt, target.index)
        after = target.log_cursor if target is not None and continues else since

        def by_sql() -> int | None:
            return sql.continue_log_chain(
                *key, since=after, cursor=cursor, lines=batch, first_at=first_at, last_at=last_at, size=size
            )

        def by_orm() -> int | None:
            workload_id, attempt, index = key
            chain = Replica.all_tenants.filter(workload_id=workload_id, attempt=attempt, index=index, log_cursor=after)
            if not chain.update(log_cursor=cursor):
                return None
            numbered = Workload.all_tenants.get(pk=workload_id)
            Workload.all_tenants.filter(pk=workload_id).update(log_seq=numbered.log_seq + len(batch))
            LogChunk.all_tenants.create(
                tenant_id=numbered.tenant_id,
                workload_id=workload_id,
                first_seq=numbered.log_seq + 1,
                last_seq=numbered.log_seq + len(batch),
                first_at=first_at,
                last_at=last_at,
                lines=[[numbered.log_seq + n, *line, attempt, index] for n, line in enumerate(batch, 1)],
                size_bytes=size,
            )
            return numbered.log_seq + 1

        def outcome(write: Callable[[], int | None]) -> tuple[Any, ...]:
            """Return what `write` returns and the three tables after it, in a savepoint rolled back after."""
            with rolled_back():
                chunk_fields = ("tenant_id", "workload_id", "first_seq", "last_seq", "first_at", "last_at", "lines")
                return (
                    write(),
                    list(Replica.all_tenants.order_by("pk").values_list("pk", "log_cursor")),
                    list(Workload.all_tenants.order_by("pk").values_list("pk", "log_seq")),
                    list(LogChunk.all_tenants.values_list(*chunk_fields, "size_bytes")),
                )

        assert outcome(by_sql) == outcome(by_orm)
