"""common.fast_bulk: `insert` stores what `bulk_create` stores, `new` builds what the model's constructor builds.

Every test runs on the configured database: on Postgres `insert` takes its
own path (one JSON document expanded in SQL), on SQLite it is `bulk_create`,
so there the comparisons hold by construction and the tests pin the shared
contract. Rows are compared as read back through the ORM, value and type, so
a `0` read where `False` was written, a naive datetime, or a JSON `1.0` that
became `1` would fail. Each write happens in a savepoint that is rolled back,
so the same instances (unique idempotency keys and slugs included) can be
written both ways, and append-only audit rows need no deletion.

Every test runs twice, with the fast path's switch (`FAST_PATHS["bulk_instances"]`)
on and off: off, `insert` and `new` are `bulk_create` and the constructor,
and must keep the same contract.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

import pytest
from django.db import DataError, models, transaction
from django.db.models.signals import post_init
from django.test.utils import isolate_apps
from django.utils import timezone

from common import fast_bulk, fastpaths
from jobs.models import Workload
from tenants.choices import Via
from tenants.models import AuditEvent, Tenant
from tests.conftest import World

M = TypeVar("M", bound=models.Model)
NEW_YORK = ZoneInfo("America/New_York")
KOLKATA = ZoneInfo("Asia/Kolkata")  # a half-hour offset
NAME_63 = "é" * 62 + "🚀"  # exactly the 63 characters Workload.name holds, none of them ASCII


@pytest.fixture(autouse=True, params=[True, False], ids=["fast", "framework"])
def bulk_instances(request: pytest.FixtureRequest, settings: Any) -> bool:
    """The fast path's switch (common.fastpaths), on then off, for every test here."""
    settings.FAST_PATHS = {**settings.FAST_PATHS, fastpaths.BULK_INSTANCES: request.param}
    return bool(request.param)


class _Undo(Exception):
    """Raised to roll a savepoint back once its rows have been read."""


def plain(value: Any) -> Any:
    """Return `value` in a form whose equality also compares types (False is not 0, 1.0 is not 1)."""
    if isinstance(value, datetime):
        assert value.utcoffset() is not None, f"naive datetime {value!r}"
        return ("datetime", value.astimezone(UTC).isoformat())
    if isinstance(value, dict | list):
        return ("json", json.dumps(value, sort_keys=True))
    if isinstance(value, str):  # a TextChoices member is the text it stands for
        return ("str", str(value))
    return (type(value).__name__, value)


def stamped(model: type[models.Model]) -> set[str]:
    """Return the attnames of the model's `auto_now` and `auto_now_add` fields."""
    return {
        f.attname
        for f in model._meta.concrete_fields
        if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False)
    }


def row(obj: models.Model, *, stamps: bool = False) -> dict[str, Any]:
    """Return every concrete field's value but the primary key's (and, unless `stamps`, the auto_now ones')."""
    skip = set() if stamps else stamped(type(obj))
    return {
        f.attname: plain(getattr(obj, f.attname))
        for f in obj._meta.concrete_fields
        if not f.primary_key and f.attname not in skip
    }


@contextmanager
def rolled_back() -> Iterator[None]:
    """Run the block in a savepoint that is rolled back afterwards (the block ends by raising _Undo)."""
    with suppress(_Undo), transaction.atomic():
        yield


def written(write: Callable[[list[M]], Any], objs: list[M]) -> tuple[list[M], list[M]]:
    """Write `objs` with `write`; return them and their rows as read back, in the same order; undo the write."""
    model = type(objs[0])
    with rolled_back():
        write(objs)
        loaded = model._base_manager.in_bulk([obj.pk for obj in objs])
        rows = [loaded[obj.pk] for obj in objs]
        raise _Undo
    return objs, rows


def workloads(world: World) -> list[Workload]:
    """Return new workloads covering JSON (unicode, nesting, booleans, null inside), aware datetimes with
    microseconds in several zones, None in nullable columns, and boundary lengths and numbers."""
    base = {
        "tenant_id": world.tenant_a.pk,
        "project_id": world.project_a.pk,
        "owner_id": world.member_a.pk,
        "pool_id": world.pool.pk,
        "image": "registry.example.com/team/train:1.0",
    }
    return [
        Workload(
            **base,
            name=NAME_63,
            command=["python", "-c", 'print("ünï\\"cødé")\n', "--lr=3e-4"],
            env={"LANG": "de_DE.UTF-8", "GREETING": "grüß dich 👋", "nested": {"on": True, "off": False, "n": None}},
            gpu_models=["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"],
            submitted_at=datetime(2024, 3, 10, 1, 59, 59, 999999, tzinfo=NEW_YORK),
            scheduled_at=datetime(2024, 3, 10, 7, 0, 0, 1, tzinfo=UTC),
            started_at=datetime(2024, 3, 10, 12, 30, 0, 123456, tzinfo=KOLKATA),
            finished_at=None,
            max_runtime_seconds=None,
            exit_code=-9,
            queue_position=0,
            log_seq=2**40,
            cpu_milli=0,
            reason_message='line one\nline two\t"quoted" \\ back',
            idempotency_key="key-ü",
        ),
        Workload(
            **base,
            name="plain",
            command=[],
            env={},
            gpu_models=[1, 1.5, "x", None, [True, False]],
            submitted_at=datetime(2024, 11, 3, 1, 30, 0, 500000, tzinfo=NEW_YORK),
            max_runtime_seconds=3600,
            exit_code=0,
            idempotency_key=None,
        ),
        Workload(**base, name="defaults", submitted_at=datetime(2025, 6, 30, 23, 59, 59, 999999, tzinfo=UTC)),
    ]


def audit_events(world: World) -> list[AuditEvent]:
    """Return new audit events with IPv4, IPv6 (written in upper case) and no source address, and before/after
    as None or as documents."""
    common = {"via": Via.API, "action": "workload.submit", "object_type": "workload"}
    return [
        AuditEvent(
            tenant_id=world.tenant_a.pk,
            actor_id=world.admin_a.pk,
            actor_label="admin_a",
            source_ip="203.0.113.7",
            before=None,
            after={"name": "train", "gpus": 2, "env": {"Ü": "✓"}, "on": True},
            **common,
        ),
        AuditEvent(
            tenant_id=world.tenant_a.pk,
            actor_id=None,
            actor_label="système",
            source_ip="2001:DB8::1",
            before={"state": "running", "exit_code": None},
            after=None,
            **common,
        ),
        AuditEvent(tenant_id=None, actor_label="cli", source_ip=None, **common),
        AuditEvent(
            tenant_id=world.tenant_b.pk, actor_label="x", source_ip="::ffff:192.0.2.1", before={}, after=[], **common
        ),
        # A blank address is stored as NULL.
        AuditEvent(tenant_id=None, actor_label="blank address", source_ip="", before={}, after={}, **common),
    ]


def tenants() -> list[Tenant]:
    """Return new tenants: the models' boolean column (`is_active`) both ways, None and numbers in nullable ints."""
    return [
        Tenant(slug="bulk-one", name="Bulk ✓", is_active=False, notebook_idle_timeout_seconds=None),
        Tenant(
            slug="bulk-two", name="Bulk two", is_active=True, notebook_idle_timeout_seconds=3600, log_retention_days=1
        ),
    ]


Build = Callable[[World], Sequence[models.Model]]
MODELS = [
    pytest.param(workloads, id="workloads"),
    pytest.param(audit_events, id="audit events"),
    pytest.param(lambda world: tenants(), id="tenants"),
]


@pytest.mark.parametrize("build", MODELS)
def test_insert_stores_the_rows_bulk_create_stores(world: World, build: Build) -> None:
    # Rows are read back by each instance's primary key, so this also shows every key names its own row.
    _, expected = written(lambda objs: type(objs[0])._base_manager.bulk_create(objs), list(build(world)))
    _, got = written(fast_bulk.insert, list(build(world)))
    assert [row(r) for r in got] == [row(r) for r in expected]


def test_insert_stores_the_rows_save_stores(world: World) -> None:
    def save_each(objs: list[Workload]) -> None:
        for obj in objs:
            obj.save()

    _, expected = written(save_each, workloads(world))
    _, got = written(fast_bulk.insert, workloads(world))
    assert [row(r) for r in got] == [row(r) for r in expected]


def test_inserted_workloads_hold_what_was_stored(world: World) -> None:
    instances, rows = written(fast_bulk.insert, workloads(world))
    assert [row(obj, stamps=True) for obj in instances] == [row(r, stamps=True) for r in rows]


@pytest.mark.parametrize("build", MODELS)
def test_insert_sets_primary_keys_in_order_and_fills_auto_now_fields(world: World, build: Build) -> None:
    objs = list(build(world))
    names = stamped(type(objs[0]))
    assert names, "every model here has an auto_now or auto_now_add field"
    before = timezone.now()
    with rolled_back():
        returned = fast_bulk.insert(objs)
        after = timezone.now()
        loaded = type(objs[0])._base_manager.in_bulk([obj.pk for obj in objs])
        raise _Undo
    assert returned == objs and all(a is b for a, b in zip(returned, objs, strict=True))
    pks = [obj.pk for obj in objs]
    assert all(isinstance(pk, int) for pk in pks) and pks == sorted(set(pks))
    assert all(not obj._state.adding and obj._state.db == "default" for obj in objs)
    for obj in objs:
        for name in names:
            value = getattr(obj, name)
            assert isinstance(value, datetime) and before <= value <= after
            assert getattr(loaded[obj.pk], name) == value


def test_insert_stores_none_json_as_sql_null_and_each_event_in_its_own_row(world: World) -> None:
    objs = audit_events(world)
    with rolled_back():
        fast_bulk.insert(objs)
        events = AuditEvent.all_tenants.filter(pk__in=[obj.pk for obj in objs])
        sql_nulls = (
            set(events.filter(before__isnull=True).values_list("pk", flat=True)),
            set(events.filter(after__isnull=True).values_list("pk", flat=True)),
        )
        raise _Undo
    # None is SQL NULL in a nullable JSON column, as Django stores it (JSON null would read back as None too,
    # but not match `isnull`).
    assert sql_nulls == ({objs[0].pk, objs[2].pk}, {objs[1].pk, objs[2].pk})
    _, rows = written(fast_bulk.insert, audit_events(world))
    assert [(r.actor_label, r.before, r.after) for r in rows] == [(o.actor_label, o.before, o.after) for o in objs]
    assert [r.source_ip for r in rows] == ["203.0.113.7", "2001:db8::1", None, "::ffff:192.0.2.1", None]


@pytest.mark.postgres
def test_a_value_too_long_for_its_column_is_refused_not_cut_short(world: World) -> None:
    # Postgres only: SQLite ignores a varchar's length and would store all 64 characters either way.
    too_long = workloads(world)[2]
    too_long.name = NAME_63 + "x"
    with pytest.raises(DataError, match="too long"), transaction.atomic():
        fast_bulk.insert([too_long])
    fits = workloads(world)[2]
    fits.name = NAME_63
    _, rows = written(fast_bulk.insert, [fits])
    assert rows[0].name == NAME_63


WORKLOAD_VALUES = {
    "tenant_id": 1,
    "project_id": 2,
    "owner_id": 3,
    "pool_id": 4,
    "name": "train",
    "image": "registry.example.com/team/train:1.0",
    "command": ["python", "train.py"],
    "env": {"A": "1"},
    "replicas": 2,
    "max_runtime_seconds": None,
    "idempotency_key": "k",
    "submitted_at": datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
}


def attnames(obj: models.Model) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def test_new_builds_what_the_constructor_builds() -> None:
    built = fast_bulk.new(Workload, WORKLOAD_VALUES)
    assert attnames(built) == attnames(Workload(**WORKLOAD_VALUES))
    assert built.pk is None and built._state.adding and built._state.db is None


def test_new_fills_every_other_field_with_its_default() -> None:
    submitted = {"submitted_at": WORKLOAD_VALUES["submitted_at"]}
    assert attnames(fast_bulk.new(Workload, submitted)) == attnames(Workload(**submitted))
    before = timezone.now()
    fresh = fast_bulk.new(Workload, {})
    assert before <= fresh.submitted_at <= timezone.now()  # a callable default is called, not shared
    other = fast_bulk.new(Workload, {})
    assert fresh.command == [] and fresh.command is not other.command and fresh.env is not other.env


def test_new_refuses_a_name_the_model_has_not() -> None:
    with pytest.raises(TypeError, match="nonsense"):
        fast_bulk.new(Workload, {**WORKLOAD_VALUES, "nonsense": 1})
    # Attribute names only: a foreign key goes by its `_id`, as the docstring says.
    with pytest.raises(TypeError, match="project"):
        fast_bulk.new(Workload, {"project": object()})


def test_insert_of_nothing_returns_nothing_and_runs_no_query(
    db: None, django_assert_num_queries: Callable[..., Any]
) -> None:
    with django_assert_num_queries(0):
        assert fast_bulk.insert([]) == []
    assert not Workload.all_tenants.exists()


def test_inserted_rows_outside_a_savepoint_are_there_for_the_orm(world: World) -> None:
    objs = fast_bulk.insert(workloads(world))
    assert Workload.all_tenants.filter(pk__in=[obj.pk for obj in objs]).count() == len(objs)
    assert Workload.all_tenants.get(pk=objs[0].pk).started_at == datetime(2024, 3, 10, 7, 0, 0, 123456, tzinfo=UTC)


def test_a_date_inside_a_json_field_is_refused_as_bulk_create_refuses_it(world: World) -> None:
    def refusal(write: Callable[[list[AuditEvent]], Any]) -> type[Exception]:
        event = AuditEvent(tenant_id=None, actor_label="x", via=Via.API, action="a", object_type="o")
        event.after = {"at": datetime(2026, 11, 24, tzinfo=UTC)}
        with pytest.raises(TypeError) as raised, rolled_back():
            write([event])
        return raised.type

    assert refusal(fast_bulk.insert) is refusal(AuditEvent.all_tenants.bulk_create) is TypeError


def test_new_goes_through_the_constructor_when_something_listens_to_init() -> None:
    seen: list[Workload] = []

    def listener(sender: type[models.Model], instance: Workload, **kwargs: Any) -> None:
        seen.append(instance)

    post_init.connect(listener, sender=Workload)
    try:
        built = fast_bulk.new(Workload, {"name": "heard"})
    finally:
        post_init.disconnect(listener, sender=Workload)
    assert seen == [built]
    assert fast_bulk.new(Workload, {"name": "unheard"}).name == "unheard"
    assert len(seen) == 1


@pytest.mark.parametrize(
    "unsupported",
    [
        pytest.param(lambda: models.DecimalField(max_digits=5, decimal_places=2), id="decimal"),
        pytest.param(models.UUIDField, id="uuid"),
        pytest.param(models.BinaryField, id="binary"),
    ],
)
def test_a_field_json_cannot_carry_is_refused_on_every_database(
    db: None, django_assert_num_queries: Callable[..., Any], unsupported: Callable[[], models.Field[Any, Any]]
) -> None:
    # On SQLite `insert` is `bulk_create`, which would store such a field; it must refuse it all the same, so
    # the default test run catches a model that the Postgres path cannot carry.
    with isolate_apps("tests"):

        class Reading(models.Model):
            label = models.CharField(max_length=20)
            value = unsupported()

            class Meta:
                app_label = "tests"

            def __str__(self) -> str:
                return self.label

        # No table exists for the model: the refusal comes before any query.
        with pytest.raises(TypeError, match=r"Reading\.value"), django_assert_num_queries(0):
            fast_bulk.insert([Reading(label="a")])
        with pytest.raises(TypeError, match=r"Reading\.value"):
            fast_bulk.new(Reading, {"label": "a"})
