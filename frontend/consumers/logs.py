"""`/ws/workloads/<id>/logs/?tail=N | ?after=SEQ`: a workload's stored log lines, then each new batch as stored."""

from __future__ import annotations

import asyncio
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings

from frontend.consumers.base import BadParameter, int_param
from frontend.consumers.workloads import WorkloadStream
from jobs.live import logs_group, state_message, workload_group
from jobs.selectors import live_log_lines, live_log_tail, live_workload_state, output_settled

# Lines per message when the snapshot or a catch-up reads many.
PAGE = 1000
MAX_SEQ = 2**63 - 1
# While an ended workload's last output is on its way, how often the stream looks whether it has all come
# (besides each batch that arrives): a lost batch is read again from the node, or given up after a while.
SETTLE_CHECK_SECONDS = 2.0


class LogConsumer(WorkloadStream):
    """Sends each line once, in order: `last_seq` drops what was sent, a gap is filled from the database first.

    `ended` is said only once the workload has ended AND its output is all
    stored (`output_settled`): an exit report can overtake its last log
    batches, and a client stops reading at `ended`.
    """

    tail: int
    after: int | None
    last_seq = 0
    state: str | None = None
    ended = False
    _settling: asyncio.Task[None] | None = None

    def parse(self, route: dict[str, Any], params: dict[str, str]) -> None:
        super().parse(route, params)
        if "tail" in params and "after" in params:
            raise BadParameter("tail, after: give one or the other")
        maximum = int(settings.LIVE_LOG_TAIL_MAX)
        default = min(int(settings.LIVE_LOG_TAIL_DEFAULT), maximum)
        self.tail = int_param(params, "tail", default=default, minimum=0, maximum=maximum) or 0
        self.after = int_param(params, "after", default=None, minimum=0, maximum=MAX_SEQ)

    async def start(self) -> None:
        await self.join(logs_group(self.workload_id))
        await self.join(workload_group(self.workload_id))
        if self.after is None:
            self.last_seq, lines = await database_sync_to_async(live_log_tail)(self.workload, tail=self.tail)
            await self.emit({"type": "lines", "snapshot": True, "lines": lines})
        else:
            self.last_seq = self.after
            await self.catch_up(snapshot=True)
        state = await database_sync_to_async(live_workload_state)(self.workload)
        if state is not None:
            await self.send_state(state)

    async def catch_up(self, *, snapshot: bool = False) -> None:
        """Send every stored line after `last_seq`, a page per message (the first one marked as the snapshot)."""
        while True:
            lines = await database_sync_to_async(live_log_lines)(self.workload, since=self.last_seq, limit=PAGE)
            if lines or snapshot:
                await self.send_lines(lines, snapshot=snapshot)
            snapshot = False
            if len(lines) < PAGE:
                return

    async def send_lines(self, lines: list[list[Any]], *, snapshot: bool = False) -> None:
        message: dict[str, Any] = {"type": "lines", "snapshot": True} if snapshot else {"type": "lines"}
        await self.emit({**message, "lines": lines})
        if lines:
            self.last_seq = max(self.last_seq, lines[-1][0])

    async def send_state(self, state: str) -> None:
        if state == self.state:
            return
        self.state = state
        ended = state_message(state)["ended"]
        self.ended = ended and await database_sync_to_async(output_settled)(self.workload)
        await self.emit({"type": "state", "state": state, "ended": self.ended})
        if ended and not self.ended and self._settling is None:
            self._settling = asyncio.create_task(self._await_settled())
            self._tasks.append(self._settling)

    async def _await_settled(self) -> None:
        try:
            while not self.ended and self.state is not None and state_message(self.state)["ended"]:
                await asyncio.sleep(SETTLE_CHECK_SECONDS)
                await self._end_if_settled()
        finally:
            self._settling = None

    async def _end_if_settled(self) -> None:
        """Once the ended workload's output is all stored: send what is left, then `ended`."""
        if self.ended or self.state is None or not await database_sync_to_async(output_settled)(self.workload):
            return
        self.ended = True
        await self.catch_up()
        await self.emit({"type": "state", "state": self.state, "ended": True})

    # --- group messages ---------------------------------------------------------------------

    async def log_lines(self, event: dict[str, Any]) -> None:
        fresh = [line for line in event["lines"] if line[0] > self.last_seq]
        if fresh and fresh[0][0] > self.last_seq + 1:
            # A batch went missing (a full queue, a Redis blip): the database has it.
            await self.catch_up()
            fresh = [line for line in fresh if line[0] > self.last_seq]
        if fresh:
            await self.send_lines(fresh)
        if self._settling is not None:  # an ended workload's last output may be this batch
            await self._end_if_settled()

    async def workload_changed(self, event: dict[str, Any]) -> None:
        await self.send_state(event["state"])

    async def workload_allocations(self, event: dict[str, Any]) -> None:
        """Allocations are the metrics stream's concern."""
