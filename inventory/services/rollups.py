"""Per-minute GPU rollups: the sample history agents report, merged into `GpuMinute`, and its retention.

A report carries every sample its node took since its previous report, as
`"history": {uuid: [[timestamp, utilization_gpu, memory_used_mib, power_w,
temperature_c], ...]}` (timestamps in seconds since the epoch, node clock).
Reports without a history (simulated nodes' heartbeats, older agents)
contribute their latest samples instead.

A batch of reports is folded in Python into one partial rollup per (GPU,
minute) and merged into the table with one set-based upsert: sums and
counts add up, maxima take the greater, so partials of the same minute from
different batches combine exactly. Replays never count twice: each node
remembers the timestamp of its newest sample rolled up
(`Node.samples_rolled_up_until`, updated in the same transaction) and
samples at or before it are skipped. The cost is that a node's samples
delivered out of order across batches are dropped, which the mailbox's
FIFO queue and the agent's in-order sends make rare.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from inventory import fast_sql
from inventory.models import GpuMinute, Node

# Samples stamped further ahead of the controller's clock than this are refused: a node clock far in the future
# would otherwise push its node's replay mark past every honest sample to come.
FUTURE_TOLERANCE_SECONDS = 120.0
PURGE_BATCH = 10_000


@dataclass
class MinutePartial:
    """What some samples of one GPU in one minute add up to; `add` one more, merge by adding fields."""

    samples: int = 0
    utilization_sum: float = 0.0
    utilization_max: float = 0.0
    memory_used_max_mib: int | None = None
    power_samples: int = 0
    power_sum: float = 0.0
    temperature_max: float | None = None

    def add(self, utilization: float, memory: int | None, power: float | None, temperature: float | None) -> None:
        self.utilization_max = utilization if self.samples == 0 else max(self.utilization_max, utilization)
        self.samples += 1
        self.utilization_sum += utilization
        if memory is not None and (self.memory_used_max_mib is None or memory > self.memory_used_max_mib):
            self.memory_used_max_mib = memory
        if power is not None:
            self.power_samples += 1
            self.power_sum += power
        if temperature is not None and (self.temperature_max is None or temperature > self.temperature_max):
            self.temperature_max = temperature


Partials = dict[tuple[int, int], MinutePartial]
"""{(GPU id, start of the minute in seconds since the epoch): partial rollup}."""


# JSON numbers decode to exactly these types; `type(x) in` is also the cheapest test that rejects bools.
_NUMBER_TYPES = frozenset({int, float})


def _finite(value: Any) -> bool:
    return type(value) in _NUMBER_TYPES and math.isfinite(value)


def parse_point(raw: Any) -> tuple[float, float, int | None, float | None, float | None] | None:
    """Return a history entry as (timestamp, utilization, memory MiB, power W, temperature C), or None if malformed.

    The timestamp must be finite and utilization a percentage (0 to 100);
    other readings that are missing, negative or not numbers count as unknown.
    """
    if type(raw) not in (list, tuple) or len(raw) != 5:
        return None
    at, utilization, memory, power, temperature = raw
    if not (_finite(at) and _finite(utilization) and 0 <= utilization <= 100):
        return None
    return (
        float(at),
        float(utilization),
        int(memory) if _finite(memory) and memory >= 0 else None,
        float(power) if _finite(power) and power >= 0 else None,
        float(temperature) if _finite(temperature) else None,
    )


def report_history(report: Mapping[str, Any]) -> dict[str, list[Any]]:
    """Return a report's history by GPU UUID; a report without one yields its latest samples as one point each."""
    history = report.get("history")
    if isinstance(history, dict):
        return {str(uuid): points for uuid, points in history.items() if isinstance(points, list)}
    return {
        str(sample.get("uuid")): [
            [
                sample.get("timestamp"),
                sample.get("utilization_gpu"),
                sample.get("memory_used_mib"),
                sample.get("power_w"),
                sample.get("temperature_c"),
            ]
        ]
        for sample in report.get("samples") or []
        if isinstance(sample, dict) and not sample.get("lost")
    }


def fold_reports(
    reports: Iterable[Mapping[str, Any]],
    *,
    nodes: Mapping[str, int],
    gpus: Mapping[str, tuple[int, int]],
    rolled_up_until: Mapping[int, float | None],
    window: tuple[float, float],
) -> tuple[Partials, dict[int, float]]:
    """Fold the reports' history into per-(GPU, minute) partials; return them and each node's newest sample.

    `nodes` maps node names to ids, `gpus` UUIDs to (GPU id, node id): a
    report counts only for its own node's GPUs. Samples at or before their
    node's `rolled_up_until` mark, outside `window` (earliest, latest
    timestamp accepted) or repeated within the batch are skipped. Pure.
    """
    partials: Partials = {}
    newest: dict[int, float] = {}
    seen: set[tuple[int, float]] = set()
    earliest, latest = window
    for report in reports:
        node_id = nodes.get(str(report.get("node")))
        if node_id is None:
            continue
        mark = rolled_up_until.get(node_id)
        after = max(earliest, mark) if mark is not None else earliest
        for uuid, points in report_history(report).items():
            gpu = gpus.get(uuid)
            if gpu is None or gpu[1] != node_id:
                continue
            for raw in points:
                point = parse_point(raw)
                if point is None or not after < point[0] <= latest or (gpu[0], point[0]) in seen:
                    continue
                seen.add((gpu[0], point[0]))
                key = (gpu[0], int(point[0] // 60) * 60)
                partial = partials.get(key)
                if partial is None:
                    partial = partials[key] = MinutePartial()
                partial.add(*point[1:])
                if point[0] > newest.get(node_id, -math.inf):
                    newest[node_id] = point[0]
    return partials, newest


def roll_up_reports(
    reports: list[dict[str, Any]], *, nodes: Mapping[str, int], gpus: Mapping[str, tuple[int, int]], now: datetime
) -> int:
    """Merge the sample history of `reports` into GpuMinute; return how many samples were new.

    `nodes` maps the names of the nodes to roll up for to their ids; `gpus`
    maps the UUIDs of their present GPUs to (GPU id, node id). Samples older
    than the retention period or stamped more than FUTURE_TOLERANCE_SECONDS
    ahead of `now` are ignored. Locks the nodes' rows (in id order) so that
    concurrent batches for the same node merge one after the other; runs in
    the caller's transaction, or its own.
    """
    if not nodes:
        return 0
    horizon = now.timestamp()
    window = (horizon - settings.TELEMETRY_RETENTION_DAYS * 86400.0, horizon + FUTURE_TOLERANCE_SECONDS)
    with transaction.atomic(savepoint=False):
        marks = dict(
            Node.objects.select_for_update()
            .filter(pk__in=sorted(nodes.values()))
            .order_by("pk")
            .values_list("pk", "samples_rolled_up_until")
        )
        partials, newest = fold_reports(reports, nodes=nodes, gpus=gpus, rolled_up_until=marks, window=window)
        if not partials:
            return 0
        merge_minutes(partials)
        fast_sql.advance_rollup_marks(newest)
    return sum(partial.samples for partial in partials.values())


def merge_minutes(partials: Partials) -> None:
    """Merge `partials` into GpuMinute with one upsert.

    Rows go in (GPU, minute) order, so concurrent merges lock them in the
    same order and never deadlock each other.
    """
    rows = [
        (
            gpu_id,
            minute,
            p.samples,
            p.utilization_sum,
            p.utilization_max,
            p.memory_used_max_mib,
            p.power_samples,
            p.power_sum,
            p.temperature_max,
        )
        for (gpu_id, minute), p in sorted(partials.items())
    ]
    fast_sql.merge_gpu_minutes(rows)


def purge_expired_minutes(*, now: datetime, batch: int = PURGE_BATCH) -> int:
    """Delete rollup minutes older than TELEMETRY_RETENTION_DAYS; return how many were deleted.

    Deletes the oldest first, `batch` rows at a time, each batch its own
    short transaction, so a large backlog never holds locks for long.
    """
    cutoff = now - timedelta(days=settings.TELEMETRY_RETENTION_DAYS)
    deleted = 0
    while True:
        ids = list(GpuMinute.objects.filter(minute__lt=cutoff).order_by("minute").values_list("pk", flat=True)[:batch])
        if not ids:
            return deleted
        deleted += GpuMinute.objects.filter(pk__in=ids).delete()[0]
        if len(ids) < batch:
            return deleted
