"""`flush` that can wipe the append-only audit log along with everything else."""

from __future__ import annotations

from typing import Any

from django.core.management.commands.flush import Command as FlushCommand
from django.db import connections

from tenants.audit_guard import audit_purge_allowed


class Command(FlushCommand):
    help = FlushCommand.help + " The audit log's append-only guard is lifted for the wipe only."

    def handle(self, **options: Any) -> None:
        with audit_purge_allowed(connections[options["database"]]):
            super().handle(**options)
