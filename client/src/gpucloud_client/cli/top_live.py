"""What `gpc top` shows and how it stays live.

Every few seconds the running workloads are listed again; each has its own metrics stream (a task), so
new workloads appear and ended ones leave without restarting the display.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.text import Text

    from gpucloud_client.aclient import AsyncClient
    from gpucloud_client.cli.state import AppState
    from gpucloud_client.models import GpuBatch, GpuSample, WorkloadDetail

RELIST_SECONDS = 5.0  # how often the running workloads are listed again


@dataclass
class TopModel:
    """The running workloads on show and the newest sample of each of their GPUs (by UUID)."""

    owner: str | None
    workloads: dict[int, WorkloadDetail] = field(default_factory=dict)
    samples: dict[str, tuple[GpuSample, str, float]] = field(default_factory=dict)  # uuid -> (sample, node, at)

    def take(self, batch: GpuBatch) -> None:
        """Keep the batch's samples as the newest of their GPUs."""
        for sample in batch.gpus:
            self.samples[sample.uuid] = (sample, batch.node, batch.at)

    def render(self, tenant: str) -> RenderableType:
        """Return the title line and the table: one row per GPU held by a workload on show."""
        from rich.console import Group
        from rich.text import Text

        from gpucloud_client.cli.output import make_table

        rows = [row for detail in sorted(self.workloads.values(), key=lambda d: d.id) for row in self._rows(detail)]
        who = self.owner or "everyone"
        gpus = f"{len(rows)} GPU" if len(rows) == 1 else f"{len(rows)} GPUs"
        title = f"gpc top: {who} in {tenant}: {len(self.workloads)} running, {gpus} (q quits)"
        columns = ("ID", "NAME", "NODE", "GPU", "MODEL", "UTIL", "MEMORY", "POWER", "TEMP", "SEEN")
        body: RenderableType = make_table(columns, rows) if rows else Text("No running workloads.", style="dim")
        return Group(Text(title, style="bold"), body)

    def _rows(self, detail: WorkloadDetail) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        for held in (a for a in detail.allocations if a.released_at is None and a.gpu_uuid):
            sample, _node, at = self.samples.get(held.gpu_uuid or "", (None, held.node, None))
            rows.append(
                (
                    detail.id,
                    detail.name,
                    held.node,
                    held.gpu_index,
                    held.gpu_model,
                    utilization_bar(sample.utilization_gpu if sample else None),
                    memory_text(sample),
                    f"{sample.power_w:.0f} W" if sample and sample.power_w is not None else None,
                    f"{sample.temperature_c:.0f} °C" if sample and sample.temperature_c is not None else None,
                    f"{max(0, time.time() - at):.0f}s ago" if at else "waiting",
                )
            )
        return rows


def utilization_bar(percent: float | None, width: int = 10) -> Text:
    """Return a bar of `width` cells and the percentage ("█████░░░░░  50%"); `-` when unknown."""
    from rich.text import Text

    if percent is None:
        return Text("-")
    filled = round(max(0.0, min(100.0, percent)) / 100 * width)
    style = "green" if percent >= 60 else "yellow" if percent >= 20 else "red"
    return Text.assemble(("█" * filled, style), ("░" * (width - filled), "dim"), f" {percent:3.0f}%")


def memory_text(sample: GpuSample | None) -> str | None:
    """Return "used / total GiB" of a sample (None when the GPU reports nothing)."""
    if sample is None or sample.memory_used_mib is None:
        return None
    total = f" / {sample.memory_total_mib / 1024:.1f}" if sample.memory_total_mib else ""
    return f"{sample.memory_used_mib / 1024:.1f}{total} GiB"


async def run_top(state: AppState, interval: float, everyone: bool) -> None:
    """Show the live table (or print sample records for -o json|yaml) until q, Ctrl-C or a stream error."""
    client = state.aclient()
    try:
        owner = None if everyone else (await client.me()).username
        model = TopModel(owner)
        changed = asyncio.Event()
        if state.structured:
            await _follow_running(client, model, changed, record=state.output)
            return
        from gpucloud_client.cli.live import run_live

        tenant = client.tenant or ""
        producer = _follow_running(client, model, changed)
        await run_live(lambda: model.render(tenant), [producer], changed, interval=interval, screen=True)
    finally:
        await client.aclose()


async def _follow_running(
    client: AsyncClient, model: TopModel, changed: asyncio.Event, *, record: str | None = None
) -> None:
    """List the running workloads every RELIST_SECONDS; keep one metrics stream per workload on show."""
    streams: dict[int, asyncio.Task[None]] = {}
    try:
        while True:
            running = await client.workloads(state="running", owner=model.owner)
            ids = {w.id for w in running}
            for gone in set(streams) - ids:
                streams.pop(gone).cancel()
                model.workloads.pop(gone, None)
            for workload_id in ids - set(streams):
                model.workloads[workload_id] = await client.workload(workload_id)
                streams[workload_id] = asyncio.create_task(_samples(client, model, workload_id, changed, record))
            changed.set()
            _raise_failed(streams)
            await asyncio.sleep(RELIST_SECONDS)
    finally:
        for task in streams.values():
            task.cancel()
        await asyncio.gather(*streams.values(), return_exceptions=True)


def _raise_failed(streams: dict[int, asyncio.Task[None]]) -> None:
    """Raise what made a metrics stream stop for good (its workload not found is fine: it just ended)."""
    from gpucloud_client.errors import EXIT_NOT_FOUND, ClientError

    for workload_id, task in list(streams.items()):
        error = task.exception() if task.done() and not task.cancelled() else None
        if isinstance(error, ClientError) and error.exit_code == EXIT_NOT_FOUND:
            del streams[workload_id]
        elif error is not None:
            raise error


async def _samples(
    client: AsyncClient, model: TopModel, workload_id: int, changed: asyncio.Event, record: str | None
) -> None:
    """Feed one workload's GPU samples into the model (or print them as records for -o json|yaml)."""
    from gpucloud_client.cli.output import emit_record

    async for batch in client.metrics(workload_id):
        if record:
            emit_record(record, {"workload": workload_id, **batch.raw})
        model.take(batch)
        changed.set()
