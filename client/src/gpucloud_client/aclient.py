"""`AsyncClient`: `Client`'s methods for asyncio: `async def`, and async iterators for the streams.

    async with AsyncClient(Config.load().resolve()) as gpc:
        jobs = await asyncio.gather(*(gpc.submit(body) for body in sweep))
        finals = await asyncio.gather(*(gpc.wait(job.id) for job in jobs))

The requests, retry rules, answers and stream bookkeeping are `Client`'s own (`operations`, `transport`,
`streams`); only the sending is asynchronous. Raises as `Client` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from gpucloud_client import operations as ops
from gpucloud_client.client import WAIT_IDLE_SECONDS, WAIT_POLL_SECONDS
from gpucloud_client.config import Context
from gpucloud_client.errors import ClientError
from gpucloud_client.models import (
    GpuBatch,
    LogLine,
    LogPage,
    Me,
    Quota,
    QuotaUse,
    Volume,
    Workload,
    WorkloadDetail,
    WorkloadRow,
)
from gpucloud_client.streams import EventsWatch, LogFollow, MetricsWatch, WaitTracker, WaitWatch, aiterate
from gpucloud_client.transport import Call, ClientBase, connection_failed, decode, http_options

if TYPE_CHECKING:
    import httpx

R = TypeVar("R")


class AsyncClient(ClientBase):
    """A console's API for asyncio, as the context's token sees it, in the context's tenant."""

    def __init__(
        self,
        context: Context,
        *,
        timeout: float = 30,
        retries: int = 4,
        transport: httpx.AsyncBaseTransport | None = None,
        backoff: float = 0.25,
    ) -> None:
        import httpx

        super().__init__(context, timeout=timeout, retries=retries, backoff=backoff)
        self._http = httpx.AsyncClient(**http_options(context, timeout, transport))

    async def aclose(self) -> None:
        """Close the client's connections."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _call(self, call: Call[R]) -> R:
        """Send `call`, retrying as `RetryPolicy` says; return its result or raise."""
        import httpx

        attempt = 0
        while True:
            try:
                answer = await self._http.request(
                    call.method, call.path, params=call.params, json=call.body, headers=call.headers
                )
            except httpx.TransportError as error:
                delay = self.policy.delay(call, attempt, None)
                if delay is None:
                    raise connection_failed(self.context, error) from error
            else:
                delay = self.policy.delay(call, attempt, answer.status_code, answer.headers.get("Retry-After"))
                if delay is None:
                    return decode(call, answer.status_code, answer.headers, answer.content)
            await asyncio.sleep(delay)
            attempt += 1

    async def _all(self, page_call: Callable[[int], Call[ops.Page[Any]]]) -> list[Any]:
        items: list[Any] = []
        page = 1
        while True:
            result = await self._call(page_call(page))
            items.extend(result.results)
            if not result.has_next:
                return items
            page += 1

    # --- reads ----------------------------------------------------------------------------

    async def me(self) -> Me:
        """Return the caller: user, operator flag, the token in use, memberships."""
        return await self._call(ops.me())

    async def workloads(
        self,
        *,
        state: str | None = None,
        kind: str | None = None,
        project: str | None = None,
        owner: str | None = None,
        pool: str | None = None,
        search: str | None = None,
        ordering: str | None = None,
    ) -> list[Workload]:
        """Return every workload of the tenant matching the filters (all pages), newest first."""
        filters = {"state": state, "kind": kind, "project": project, "owner": owner, "pool": pool}
        filters.update(search=search, ordering=ordering)
        items: list[Workload] = await self._all(lambda page: ops.workloads_page(self.tenant, filters, page))
        return items

    async def workload(self, id: int) -> WorkloadDetail:
        """Return workload `id` with its allocations, events, launch steps and notebook URL."""
        return await self._call(ops.workload(self.tenant, id))

    async def logs(self, id: int, *, since: int | None = None, limit: int = 1000) -> LogPage:
        """Return the last `limit` log lines of workload `id`, or with `since` the lines after that seq."""
        return await self._call(ops.logs(self.tenant, id, since, limit))

    async def usage(self) -> list[QuotaUse]:
        """Return the GPUs in use against the tenant's quotas and its projects'."""
        return await self._call(ops.usage(self.tenant))

    async def quotas(self) -> list[Quota]:
        """Return the tenant's quota in each pool."""
        items: list[Quota] = await self._all(lambda page: ops.quotas_page(self.tenant, page))
        return items

    async def project_quotas(self) -> list[Quota]:
        """Return the projects' quotas inside the tenant's."""
        items: list[Quota] = await self._all(lambda page: ops.project_quotas_page(self.tenant, page))
        return items

    async def volumes(self) -> list[Volume]:
        """Return the volumes the caller can see."""
        items: list[Volume] = await self._all(lambda page: ops.volumes_page(self.tenant, page))
        return items

    # --- writes ---------------------------------------------------------------------------

    async def validate(self, body: dict[str, Any]) -> list[str]:
        """Return if the API would accept submission `body`, with its budget notes; raise ApiError naming every
        failing field."""
        return await self._call(ops.validate(self.tenant, ops.with_project(body, self.context.project)))

    async def validate_bulk(self, project: str, items: list[dict[str, Any]]) -> list[str]:
        """Return if the API would accept the bulk submission, with its budget notes; raise ApiError (fields
        `items[<i>].<field>`)."""
        return await self._call(ops.validate_bulk(self.tenant, project, items))

    async def submit(self, body: dict[str, Any], *, idempotency_key: str | None = None) -> Workload:
        """Submit one workload (the context's project when `body` names none); retries reuse the key."""
        call = ops.submit(self.tenant, ops.with_project(body, self.context.project), idempotency_key)
        return await self._call(call)

    async def submit_bulk(
        self, project: str, items: list[dict[str, Any]], *, idempotency_key: str | None = None
    ) -> list[Workload]:
        """Submit `items` into `project`, all or nothing; return the workloads in the order given."""
        return await self._call(ops.submit_bulk(self.tenant, project, items, idempotency_key))

    async def cancel(self, id: int) -> Workload:
        """Cancel a pending workload or stop a running one; ApiError 409 once it has ended."""
        return await self._call(ops.action(self.tenant, id, "cancel"))

    async def restart(self, id: int) -> Workload:
        """Queue an ended workload again as a new attempt; ApiError 409 while it has not ended."""
        return await self._call(ops.action(self.tenant, id, "restart"))

    async def extend(self, id: int) -> Workload:
        """Keep an idle-warned notebook running (once per session)."""
        return await self._call(ops.action(self.tenant, id, "extend"))

    async def hibernate(self, id: int) -> Workload:
        """Stop a notebook, keeping it to resume later."""
        return await self._call(ops.action(self.tenant, id, "hibernate"))

    async def resume(self, id: int) -> Workload:
        """Queue a hibernated notebook again."""
        return await self._call(ops.action(self.tenant, id, "resume"))

    # --- streams --------------------------------------------------------------------------

    async def follow_logs(
        self, id: int, *, after: int | None = None, tail: int | None = None
    ) -> AsyncIterator[LogLine]:
        """Yield workload `id`'s log lines until it has ended and every line was yielded (`Client.follow_logs`)."""
        follow = LogFollow(id, after=after, tail=tail)
        async for line in aiterate(self.context, follow):
            yield line
        while (call := follow.drain_call(self.tenant)) is not None:
            for line in follow.feed_page(await self._call(call)):
                yield line

    async def watch(self, project: str | None = None) -> AsyncIterator[WorkloadRow]:
        """Yield the tenant's (or `project`'s) workload rows, snapshot first (`Client.watch`)."""
        async for row in aiterate(self.context, EventsWatch(self.tenant, project)):
            yield row

    async def metrics(self, id: int) -> AsyncIterator[GpuBatch]:
        """Yield workload `id`'s GPU samples, one batch per node about once a second."""
        async for batch in aiterate(self.context, MetricsWatch(id)):
            yield batch

    async def wait(self, id: int, *, on_change: Callable[[WorkloadDetail], None] | None = None) -> WorkloadDetail:
        """Return workload `id` once it has ended or hibernated, calling `on_change` whenever it changed."""
        tracker = WaitTracker(on_change)
        detail = await self.workload(id)
        if tracker.update(detail):
            return detail
        watch = WaitWatch(self.tenant, detail.project, id)
        signals = aiterate(self.context, watch, idle_timeout=WAIT_IDLE_SECONDS)
        try:
            while await _next_signal(signals):
                detail = await self.workload(id)
                if tracker.update(detail):
                    return detail
        finally:
            await signals.aclose()
        while True:
            await asyncio.sleep(WAIT_POLL_SECONDS)
            detail = await self.workload(id)
            if tracker.update(detail):
                return detail


async def _next_signal(signals: AsyncIterator[int]) -> bool:
    """Return whether the events stream gave another signal (False when it failed or ended)."""
    try:
        await anext(signals)
    except (StopAsyncIteration, ClientError):
        return False
    return True
