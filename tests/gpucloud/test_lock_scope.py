"""Row locks take only the rows they mean to: `select_for_update` beside `select_related` names its tables.

Postgres locks every table of a joined `SELECT ... FOR UPDATE` unless `OF`
says which. A report that locks its replica with the node and pool joined in
also locks the node and pool rows, which serializes every report of a pool
and blocks heartbeats and submissions that check foreign keys to them (it
deadlocked with heartbeats at 20 simulated nodes: docs/scale.md). This test
reads the product's source, so a new query of that shape fails here, and
checks on Postgres that a report's lock leaves the node and pool rows free.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.db import connection, transaction

from jobs.services.replicas import _locked_replica
from tests.jobs.factories import add_node, add_replica

ROOT = Path(__file__).resolve().parents[2]
APPS = ("accounting", "common", "gpucloud", "inventory", "jobs", "notifications", "tenants")


def _chain(node: ast.AST) -> list[ast.Call]:
    """Return the calls of a method chain `a.b(...).c(...)`, outermost first."""
    calls: list[ast.Call] = []
    while True:
        if isinstance(node, ast.Call):
            calls.append(node)
            node = node.func
        elif isinstance(node, ast.Attribute):
            node = node.value
        else:
            return calls


def _method(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else ""


def unscoped_locks(source: str) -> list[int]:
    """Return the lines where `select_for_update()` without `of=` shares a chain with `select_related`."""
    lines: list[int] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        calls = _chain(node)
        names = [_method(call) for call in calls]
        for call in calls:
            scoped = any(keyword.arg == "of" for keyword in call.keywords)
            if _method(call) == "select_for_update" and "select_related" in names and not scoped:
                lines.append(call.lineno)
    return sorted(set(lines))


def test_the_rule_finds_an_unscoped_lock_and_passes_a_scoped_one():
    assert unscoped_locks("Replica.objects.select_for_update().select_related('node').get(pk=1)") == [1]
    assert unscoped_locks("Replica.objects.select_related('node').select_for_update().first()") == [1]
    assert unscoped_locks("Replica.objects.select_for_update(of=('self',)).select_related('node').get(pk=1)") == []
    assert unscoped_locks("Node.objects.select_for_update().get(pk=1)") == []


def test_no_product_lock_takes_the_rows_it_only_reads():
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for app in APPS
        for path in sorted((ROOT / app).rglob("*.py"))
        if "migrations" not in path.parts
        for line in unscoped_locks(path.read_text())
    ]
    assert found == [], "select_for_update() with select_related must say of=(...): " + ", ".join(found)


@pytest.mark.postgres  # row locks are Postgres's (SQLite locks the whole file): required in CI's Postgres pass
@pytest.mark.django_db(transaction=True)
def test_a_replica_report_leaves_its_node_and_pool_unlocked(world):
    replica = add_replica(world, add_node(world, "lock-node"))
    with transaction.atomic():
        row = _locked_replica(replica.workload_id, replica.attempt, replica.index)
        assert row is not None and row.node.name == "lock-node"
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
                " WHERE l.pid = pg_backend_pid() AND l.mode = 'RowShareLock'"
            )
            locked = {name for (name,) in cursor.fetchall()}
    assert {"jobs_replica", "jobs_workload"} <= locked
    assert not locked & {"inventory_node", "inventory_nodepool"}
