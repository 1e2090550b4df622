"""This console's installation id: which console a container on a shared engine belongs to.

Two consoles may drive one Docker engine, and several nodes of one console
may share an engine; every workload is labelled with the installation id and
its node (`inventory.drivers.policy.owner_labels`) so that a reconcile
touches only its own.

The id is derived from a value the database has held since it was first
migrated: the first row of Django's migration ledger (its app, name and the
microsecond it was applied). It is created once per database, kept by
backups and restores (the same console, the same id), differs between two
databases set up separately, is the same in every web, controller and
agent-facing process that shares the database, and says nothing secret
(unlike SECRET_KEY, which never goes on a container).
"""

from __future__ import annotations

import functools
import hashlib

from django.db import connection
from django.db.migrations.recorder import MigrationRecorder

__all__ = ["installation_id"]


@functools.cache
def installation_id() -> str:
    """Return this console's installation id (16 hex digits); raises RuntimeError when the database is not migrated."""
    first = MigrationRecorder(connection).Migration.objects.order_by("id").values_list("app", "name", "applied").first()
    if first is None:
        raise RuntimeError("the database has not been migrated: run `gpucloud migrate` first")
    app, name, applied = first
    seed = f"gpucloud-installation:{app}.{name}@{applied.isoformat()}"
    return hashlib.sha256(seed.encode()).hexdigest()[:16]
