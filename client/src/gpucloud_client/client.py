"""`Client`: the console's API as typed, blocking methods (the `gpc` CLI is built on it).

    from gpucloud_client import Client, Config

    with Client(Config.load().resolve()) as gpc:
        job = gpc.submit({"name": "train", "image": "pytorch/pytorch:2.4", "command": "python train.py"})
        final = gpc.wait(job.id)

Every method raises `ApiError` for an error answer (with every failing field), `ConnectionFailed` when the
console cannot be reached after the retries, `ClientError` when no tenant is known. The requests and their
rules are in `operations` and `transport`, the streams' bookkeeping in `streams`: the same as `AsyncClient`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from gpucloud_client import operations as ops
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
from gpucloud_client.streams import EventsWatch, LogFollow, MetricsWatch, WaitTracker, WaitWatch, iterate
from gpucloud_client.transport import Call, ClientBase, connection_failed, decode, http_options

if TYPE_CHECKING:
    import httpx

R = TypeVar("R")
M = TypeVar("M")

WAIT_POLL_SECONDS = 2.0  # how often `wait` reads the workload when the events stream cannot be had
WAIT_IDLE_SECONDS = 15.0  # how long `wait` trusts a silent events stream before reading the workload anyway


class Client(ClientBase):
    """A console's API as the context's token sees it, in the context's tenant (see the module)."""

    def __init__(
        self,
        context: Context,
        *,
        timeout: float = 30,
        retries: int = 4,
        transport: httpx.BaseTransport | None = None,
        backoff: float = 0.25,
    ) -> None:
        import httpx  # here, not at module import: `gpc --help` must not pay for it

        super().__init__(context, timeout=timeout, retries=retries, backoff=backoff)
        self._http = httpx.Client(**http_options(context, timeout, transport))

    def close(self) -> None:
        """Close the client's connections."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _call(self, call: Call[R]) -> R:
        """Send `call`, retrying as `RetryPolicy` says; return its result or raise (see the module)."""
        import httpx

        attempt = 0
        while True:
            try:
                answer = self._http.request(
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
            time.sleep(delay)
            attempt += 1

    def _all(self, page_call: Callable[[int], Call[ops.Page[Any]]]) -> list[Any]:
        """Return every item of a paginated list, page after page."""
        items: list[Any] = []
        page = 1
        while True:
            result = self._call(page_call(page))
            items.extend(result.results)
            if not result.has_next:
                return items
            page += 1

    # --- reads ----------------------------------------------------------------------------

    def me(self) -> Me:
        """Return the caller: user, operator flag, the token in use, memberships."""
        return self._call(ops.me())

    def workloads(
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
        items: list[Workload] = self._all(lambda page: ops.workloads_page(self.tenant, filters, page))
        return items

    def workload(self, id: int) -> WorkloadDetail:
        """Return workload `id` with its allocations, events, launch steps and notebook URL."""
        return self._call(ops.workload(self.tenant, id))

    def logs(self, id: int, *, since: int | None = None, limit: int = 1000) -> LogPage:
        """Return the last `limit` log lines of workload `id`, or with `since` the lines after that seq."""
        return self._call(ops.logs(self.tenant, id, since, limit))

    def usage(self) -> list[QuotaUse]:
        """Return the GPUs in use against the tenant's quotas and its projects'."""
        return self._call(ops.usage(self.tenant))

    def quotas(self) -> list[Quota]:
        """Return the tenant's quota in each pool."""
        items: list[Quota] = self._all(lambda page: ops.quotas_page(self.tenant, page))
        return items

    def project_quotas(self) -> list[Quota]:
        """Return the projects' quotas inside the tenant's."""
        items: list[Quota] = self._all(lambda page: ops.project_quotas_page(self.tenant, page))
        return items

    def volumes(self) -> list[Volume]:
        """Return the volumes the caller can see."""
        items: list[Volume] = self._all(lambda page: ops.volumes_page(self.tenant, page))
        return items

    # --- writes ---------------------------------------------------------------------------

    def validate(self, body: dict[str, Any]) -> list[str]:
        """Return if the API would accept submission `body`, with what the budgets over its project say of it
        ("This job may use up to N of your remaining M GPU-hours"); raise ApiError naming every failing field."""
        return self._call(ops.validate(self.tenant, ops.with_project(body, self.context.project)))

    def validate_bulk(self, project: str, items: list[dict[str, Any]]) -> list[str]:
        """Return if the API would accept the bulk submission, with its budget notes; raise ApiError (fields
        `items[<i>].<field>`)."""
        return self._call(ops.validate_bulk(self.tenant, project, items))

    def submit(self, body: dict[str, Any], *, idempotency_key: str | None = None) -> Workload:
        """Submit one workload (the context's project when `body` names none) and return it.

        The Idempotency-Key (a new one when None) is the same on every retry, so a retry never submits twice.
        """
        return self._call(ops.submit(self.tenant, ops.with_project(body, self.context.project), idempotency_key))

    def submit_bulk(
        self, project: str, items: list[dict[str, Any]], *, idempotency_key: str | None = None
    ) -> list[Workload]:
        """Submit `items` into `project`, all or nothing; return the workloads in the order given."""
        return self._call(ops.submit_bulk(self.tenant, project, items, idempotency_key))

    def cancel(self, id: int) -> Workload:
        """Cancel a pending workload or stop a running one; ApiError 409 once it has ended."""
        return self._call(ops.action(self.tenant, id, "cancel"))

    def restart(self, id: int) -> Workload:
        """Queue an ended workload again as a new attempt; ApiError 409 while it has not ended."""
        return self._call(ops.action(self.tenant, id, "restart"))

    def extend(self, id: int) -> Workload:
        """Keep an idle-warned notebook running (once per session)."""
        return self._call(ops.action(self.tenant, id, "extend"))

    def hibernate(self, id: int) -> Workload:
        """Stop a notebook, keeping it to resume later."""
        return self._call(ops.action(self.tenant, id, "hibernate"))

    def resume(self, id: int) -> Workload:
        """Queue a hibernated notebook again."""
        return self._call(ops.action(self.tenant, id, "resume"))

    # --- streams --------------------------------------------------------------------------

    def follow_logs(self, id: int, *, after: int | None = None, tail: int | None = None) -> Iterator[LogLine]:
        """Yield workload `id`'s log lines as they are stored, until it has ended and every line was yielded.

        Starts after seq `after`, else with the last `tail` lines (the console's default tail when both are
        None). A dropped connection is resumed after the last line yielded: no line is lost or repeated.
        """
        follow = LogFollow(id, after=after, tail=tail)
        yield from iterate(self.context, follow)
        while (call := follow.drain_call(self.tenant)) is not None:
            yield from follow.feed_page(self._call(call))

    def watch(self, project: str | None = None) -> Iterator[WorkloadRow]:
        """Yield the tenant's (or `project`'s) workload rows: a snapshot of the unfinished ones, then changes.

        After a reconnection a new snapshot comes (rows marked `snapshot=True`). Never ends by itself.
        """
        yield from iterate(self.context, EventsWatch(self.tenant, project))

    def metrics(self, id: int) -> Iterator[GpuBatch]:
        """Yield workload `id`'s GPU samples, one batch per node about once a second. Never ends by itself."""
        yield from iterate(self.context, MetricsWatch(id))

    def wait(self, id: int, *, on_change: Callable[[WorkloadDetail], None] | None = None) -> WorkloadDetail:
        """Return workload `id` once it has ended or hibernated, calling `on_change` whenever it changed.

        Follows the project's events stream; if the stream cannot be had, reads the workload every 2 s.
        """
        tracker = WaitTracker(on_change)
        detail = self.workload(id)
        if tracker.update(detail):
            return detail
        signals = iterate(self.context, WaitWatch(self.tenant, detail.project, id), idle_timeout=WAIT_IDLE_SECONDS)
        try:
            while _next_signal(signals):
                detail = self.workload(id)
                if tracker.update(detail):
                    return detail
        finally:
            signals.close()
        while True:
            time.sleep(WAIT_POLL_SECONDS)
            detail = self.workload(id)
            if tracker.update(detail):
                return detail


def _next_signal(signals: Iterator[int]) -> bool:
    """Return whether the events stream gave another signal (False when it failed or ended)."""
    try:
        next(signals)
    except (StopIteration, ClientError):
        return False
    return True
