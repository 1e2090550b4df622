"""The database guard that makes the audit log append-only, and its one deliberate bypass.

Postgres: triggers refuse UPDATE, DELETE and TRUNCATE unless the session
sets `gpucloud.audit_purge = on`. SQLite: triggers refuse UPDATE and
DELETE; the bypass drops them for the duration and recreates them. The
bypass exists for whole-database wipes (`manage.py flush`) and retention
purges, never for editing an event.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

TABLE = "tenants_auditevent"

POSTGRES_INSTALL = f"""
CREATE OR REPLACE FUNCTION gpucloud_audit_append_only() RETURNS trigger AS $$
BEGIN
    IF coalesce(current_setting('gpucloud.audit_purge', true), '') = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit events are append-only' USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER audit_no_update BEFORE UPDATE ON {TABLE} FOR EACH ROW EXECUTE FUNCTION gpucloud_audit_append_only();
CREATE TRIGGER audit_no_delete BEFORE DELETE ON {TABLE} FOR EACH ROW EXECUTE FUNCTION gpucloud_audit_append_only();
CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON {TABLE}
    FOR EACH STATEMENT EXECUTE FUNCTION gpucloud_audit_append_only();
"""
POSTGRES_REMOVE = f"""
DROP TRIGGER IF EXISTS audit_no_update ON {TABLE};
DROP TRIGGER IF EXISTS audit_no_delete ON {TABLE};
DROP TRIGGER IF EXISTS audit_no_truncate ON {TABLE};
DROP FUNCTION IF EXISTS gpucloud_audit_append_only();
"""
SQLITE_INSTALL = [
    f"CREATE TRIGGER IF NOT EXISTS audit_no_update BEFORE UPDATE ON {TABLE} "
    "BEGIN SELECT RAISE(ABORT, 'audit events are append-only'); END;",
    f"CREATE TRIGGER IF NOT EXISTS audit_no_delete BEFORE DELETE ON {TABLE} "
    "BEGIN SELECT RAISE(ABORT, 'audit events are append-only'); END;",
]
SQLITE_REMOVE = ["DROP TRIGGER IF EXISTS audit_no_update;", "DROP TRIGGER IF EXISTS audit_no_delete;"]


def install(connection: Any) -> None:
    """Create the append-only triggers on `connection`'s database."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(POSTGRES_INSTALL)
        elif connection.vendor == "sqlite":
            for statement in SQLITE_INSTALL:
                cursor.execute(statement)


def remove(connection: Any) -> None:
    """Drop the append-only triggers from `connection`'s database."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(POSTGRES_REMOVE)
        elif connection.vendor == "sqlite":
            for statement in SQLITE_REMOVE:
                cursor.execute(statement)


@contextmanager
def audit_purge_allowed(connection: Any) -> Iterator[None]:
    """Let the block delete audit rows on `connection`; the guard is back in force afterwards."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET gpucloud.audit_purge = 'on'")
        try:
            yield
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET gpucloud.audit_purge")
    elif connection.vendor == "sqlite":
        remove(connection)
        try:
            yield
        finally:
            install(connection)
    else:
        yield
