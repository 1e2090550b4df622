"""jobs.fast_sql with its switch on and off: each read returns, each write leaves, what its ORM form does.

The ORM forms are the fast path's own fallback (`FAST_PATHS["jobs_sql"]`
off), so every test makes the same call with the switch on and off and
compares. Rows are generated (hypothesis) over the persona world's two
tenants and one pool, plus what each example adds; the project quota lock,
and the log chain (its statement is Postgres only), are checked on Postgres.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import DatabaseError, connection, transaction
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st

from common import fastpaths
from inventory.choices import GpuHealth, NodeState
from inventory.models import Gpu, Node, NodePool
from jobs import fast_sql
from jobs.choices import WorkloadKind, WorkloadState
from jobs.models import AllowedImage, LogChunk, Replica, Workload, WorkloadEvent
from jobs.services.logs.chain import ingest_log_batch
from tenants.models import Project, ProjectQuota, TenantQuota
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


T = TypeVar("T")


@contextmanager
def _switched(fast: bool) -> Iterator[None]:
    """Run the block with the fast path `jobs_sql` on (`fast`) or off (its ORM forms serve)."""
    with override_settings(FAST_PATHS={**settings.FAST_PATHS, fastpaths.JOBS_SQL: fast}):
        yield


def _both(call: Callable[[], T]) -> tuple[T, T]:
    """Return what `call` gives with the fast path on, then off."""
    with _switched(True):
        on = call()
    with _switched(False):
        return on, call()


def _rows(found: Iterable[Any]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(row) for row in found)


def _effect_both(write: Callable[[], object], read: Callable[[], T]) -> tuple[T, T]:
    """Return what `read` finds after `write` with the fast path on, then off; each in a savepoint rolled back."""
    with _switched(True):
        on = effect(write, read)
    with _switched(False):
        return on, effect(write, read)


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
        on, off = _both(lambda: fast_sql.allowed_image_rows(ids))
        assert _rows(on) == _rows(off)
        assert all(type(notebook) is bool for _, _, notebook in on + off)
        # Empty exactly when the platform has no pattern at all.
        assert bool(on) == bool(made)


# --- quota limits ---------------------------------------------------------------------------

limits = st.fixed_dictionaries({name: st.none() | counts for name in fast_sql.LIMIT_FIELDS})


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
        on, off = _both(lambda: fast_sql.quota_limits(keys, lock=lock))
        assert [tuple(row) for row in on] == [tuple(row) for row in off]
        quoted = {(projects[i // 2].pk, pools[i % 2].pk) for i, quota in enumerate(project_quotas) if quota is not None}
        assert [(row[0], row[1]) for row in on] == sorted(quoted & set(keys))


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("lock", [True, False])
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "framework"])
def test_quota_limits_lock_the_project_quota_rows_only(world: World, lock: bool, fast: bool) -> None:
    """With `lock`, another transaction cannot lock the project's quota row until this one ends; it can
    always lock the tenant's, which is only read. The same with the fast path on and off."""
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

    with transaction.atomic(), _switched(fast):
        assert len(fast_sql.quota_limits([(world.project_a.pk, world.pool.pk)], lock=lock)) == 1
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
        on, off = _both(lambda: fast_sql.gpu_counts(pool_ids, failed=GpuHealth.FAILED.value, gone_node_states=states))
        assert _rows(on) == _rows(off)
        counted = [
            (pool, present and health != GpuHealth.FAILED and state not in gone)
            for pool, state, made in nodes
            for present, health, _ in made
        ]
        assert sum(row[-1] for row in on) == sum(counts for pool, counts in counted if pool in asked)


# --- workloads (their counts are quota_rules': tests/jobs/test_quota_rules.py) ------------------

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

        def events() -> list[tuple[Any, ...]]:
            written = WorkloadEvent.all_tenants.order_by("pk")
            fields = ("tenant_id", "workload_id", "kind", "from_state", "to_state", "reason_code", "message")
            return list(written.values_list(*fields, "created_at"))

        on, off = _effect_both(
            lambda: fast_sql.insert_submitted_events(ids, kind=kind, to_state=to_state, created_at=now), events
        )
        assert on == off
        made_by_id = {row.pk: made[index] for index, row in enumerate(rows)}
        assert [event[6] for event in on] == [
            f"Submitted by {owner}{usernames[owner]}: {per_replica * replicas} GPU(s) in pool p-{pool_name}."
            for per_replica, replicas, owner in (made_by_id[pk] for pk in sorted(ids))
        ]


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

        def reasons_now() -> list[tuple[Any, ...]]:
            fields = ("pk", "state", "reason_code", "reason_message", "reason_hint", "queue_position")
            return list(Workload.all_tenants.order_by("pk").values_list(*fields))

        on, off = _effect_both(
            lambda: fast_sql.record_reasons(given_rows, pending=WorkloadState.PENDING.value), reasons_now
        )
        assert on == off
        given_by_id = {row[-1]: row[:-1] for row in given_rows}
        untouched = ("OLD", "", "", 7)
        assert on == [
            (row.pk, state, *(given_by_id.get(row.pk, untouched) if state == WorkloadState.PENDING else untouched))
            for row, state in zip(rows, states, strict=True)
        ]


@SQL_EXAMPLES
@given(
    states=st.lists(st.sampled_from(STATES), min_size=1, max_size=6),
    plans=st.lists(
        st.tuples(
            st.integers(0, 5),
            st.none() | moments,
            texts,
            st.none() | moments,
            st.lists(st.fixed_dictionaries({"node": texts, "gpus": st.lists(texts, max_size=2)}), max_size=2),
        ),
        unique_by=lambda r: r[0],
        max_size=6,
    ),
)
def test_record_plans(
    world: World, states: list[str], plans: list[tuple[int, datetime | None, str, datetime | None, list[Any]]]
) -> None:
    with rolled_back():
        rows = Workload.all_tenants.bulk_create(
            Workload(
                tenant_id=world.tenant_a.pk,
                project=world.project_a,
                owner=world.member_a,
                pool=world.pool,
                state=state,
                estimate_basis="old",
                reserved_gpus=[{"node": "old"}],
                name="w",
                image="i",
            )
            for state in states
        )
        # Some rows name a workload that does not exist.
        given_rows = [(e, b, f, g, rows[i].pk if i < len(rows) else NOBODY) for i, e, b, f, g in plans]

        def plans_now() -> list[tuple[Any, ...]]:
            fields = ("pk", "state", "estimated_start_at", "estimate_basis", "reserved_from", "reserved_gpus")
            return list(Workload.all_tenants.order_by("pk").values_list(*fields))

        on, off = _effect_both(
            lambda: fast_sql.record_plans(given_rows, pending=WorkloadState.PENDING.value), plans_now
        )
        assert on == off
        given_by_id = {row[-1]: row[:-1] for row in given_rows}
        untouched = (None, "old", None, [{"node": "old"}])
        assert on == [
            (row.pk, state, *(given_by_id.get(row.pk, untouched) if state == WorkloadState.PENDING else untouched))
            for row, state in zip(rows, states, strict=True)
        ]


# --- the log chain ---------------------------------------------------------------------------


def _workload(world: World, tenant: int, **fields: Any) -> Workload:
    """Create a workload of tenant A (0) or B (1) in its project and the shared pool, member_a's unless `fields` say."""
    project = (world.project_a, world.project_b)[tenant]
    made = {"owner": world.member_a, "name": "w", "image": "i"} | fields
    return Workload.all_tenants.create(tenant_id=project.tenant_id, project=project, pool=world.pool, **made)


lines = st.lists(
    st.tuples(moments.map(datetime.isoformat), st.sampled_from(["stdout", "stderr"]), texts), min_size=1, max_size=5
)


@pytest.mark.postgres
@SQL_EXAMPLES
@given(
    cursors=st.lists(texts, min_size=3, max_size=3),
    log_seq=st.integers(0, 2**53),
    asked=st.tuples(st.integers(0, 3), st.booleans()),  # the replica (3: none), and whether `since` is its cursor
    since=texts,
    cursor=texts,
    batch=lines,
)
def test_continue_log_chain(
    world: World,
    cursors: list[str],
    log_seq: int,
    asked: tuple[int, bool],
    since: str,
    cursor: str,
    batch: list[tuple[str, str, str]],
) -> None:
    """A batch stored through the one statement (on) leaves what the ORM path (`chain._store`, off) leaves."""
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

        def store() -> int:
            workload_id, attempt, index = key
            return ingest_log_batch(
                workload_id=workload_id,
                attempt=attempt,
                replica=index,
                since=after,
                cursor=cursor,
                lines=[list(line) for line in batch],
            )

        def outcome() -> tuple[Any, ...]:
            """Return what `store` returns and the three tables after it, in a savepoint rolled back after."""
            with rolled_back():
                chunk_fields = ("tenant_id", "workload_id", "first_seq", "last_seq", "first_at", "last_at", "lines")
                return (
                    store(),
                    list(Replica.all_tenants.order_by("pk").values_list("pk", "log_cursor")),
                    list(Workload.all_tenants.order_by("pk").values_list("pk", "log_seq")),
                    list(LogChunk.all_tenants.values_list(*chunk_fields, "size_bytes")),
                )

        on, off = _both(outcome)
        assert on == off
        stored = target is not None and (continues or target.log_cursor == since)
        assert on[0] == (len(batch) if stored else 0)
