"""`/ws/t/<tenant>/events/?project=<slug>`: a tenant's workloads that have not ended, then every change of one."""

from __future__ import annotations

import re
from typing import Any

from channels.db import database_sync_to_async

from frontend.consumers.base import BadParameter, LiveConsumer
from jobs.live import tenant_events_group
from jobs.selectors import live_events_scope, live_rows_of_tenant
from tenants.context import Actor
from tenants.models import Project, Tenant

SLUG = re.compile(r"^[-a-zA-Z0-9_]{1,100}$")


class EventsConsumer(LiveConsumer):
    """Rows of the tenant's workloads (of one project when asked): a snapshot, then each changed row."""

    tenant_slug: str
    project_slug: str | None
    tenant: Tenant
    project: Project | None

    def parse(self, route: dict[str, Any], params: dict[str, str]) -> None:
        self.tenant_slug = str(route["tenant"])
        self.project_slug = params.get("project")
        if self.project_slug is not None and not SLUG.match(self.project_slug):
            raise BadParameter("project: must be a project slug (letters, digits, - and _)")

    def authorize(self, actor: Actor) -> bool:
        scope = live_events_scope(actor, self.tenant_slug, self.project_slug)
        if scope is not None:
            self.tenant, self.project = scope
        return scope is not None

    async def start(self) -> None:
        await self.join(tenant_events_group(self.tenant.pk))
        project_id = self.project.pk if self.project is not None else None
        rows = await database_sync_to_async(live_rows_of_tenant)(self.tenant, project_id=project_id)
        await self.emit({"type": "snapshot", "workloads": rows})

    async def workload_rows(self, event: dict[str, Any]) -> None:
        for row in event["rows"]:
            if self.project_slug is None or row["project"] == self.project_slug:
                await self.emit({"type": "workload", **row})
