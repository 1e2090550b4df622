"""What the streams about one workload (its logs, its GPU metrics) share: the route, the access rule, deletion."""

from __future__ import annotations

from typing import Any

from frontend.consumers.base import REVOKED, LiveConsumer
from jobs.models import Workload
from jobs.selectors import watchable_workload
from tenants.context import Actor


class WorkloadStream(LiveConsumer):
    """A stream of `/ws/workloads/<id>/...`: anyone who may watch the workload, as on the API."""

    workload_id: int
    workload: Workload

    def parse(self, route: dict[str, Any], params: dict[str, str]) -> None:
        self.workload_id = int(route["workload_id"])

    def authorize(self, actor: Actor) -> bool:
        workload = watchable_workload(actor, self.workload_id)
        if workload is not None:
            self.workload = workload
        return workload is not None

    async def workload_deleted(self, event: dict[str, Any]) -> None:
        await self.close_with(REVOKED, "the workload was deleted")
