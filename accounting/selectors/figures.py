"""What a usage report holds: each group's seconds, utilization figures and cost, its rows and totals."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from accounting.periods import Period

_CENT = Decimal("0.01")

Window = tuple[datetime, datetime]  # [start, end)
Group = tuple[tuple[str, ...], int, str]  # (key, pool id, GPU model): a row of a report, as a price sees it


@dataclass
class Usage:
    """What one group used in a period: seconds of each resource, utilization figures and cost.

    `memory_gib_seconds` is GiB held times seconds; `utilization_minutes` sums
    each sampled held minute's average utilization (percent).
    """

    gpu_seconds: float = 0.0
    cpu_seconds: float = 0.0
    memory_gib_seconds: float = 0.0
    sampled_gpu_seconds: float = 0.0
    utilization_minutes: float = 0.0
    idle_gpu_seconds: float = 0.0
    cost: Decimal = field(default_factory=Decimal)

    def add(self, other: Usage) -> None:
        self.gpu_seconds += other.gpu_seconds
        self.cpu_seconds += other.cpu_seconds
        self.memory_gib_seconds += other.memory_gib_seconds
        self.sampled_gpu_seconds += other.sampled_gpu_seconds
        self.utilization_minutes += other.utilization_minutes
        self.idle_gpu_seconds += other.idle_gpu_seconds
        self.cost += other.cost

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600

    @property
    def utilization(self) -> float | None:
        """Average utilization (percent) of the GPUs held, over the minutes that have a reading; None without any."""
        minutes = self.sampled_gpu_seconds / 60
        return self.utilization_minutes / minutes if minutes else None

    @property
    def idle_cost(self) -> Decimal:
        """The share of the GPU cost spent holding idle GPUs, at this row's average GPU price."""
        if not self.gpu_seconds:
            return Decimal(0)
        return (self.cost * Decimal(self.idle_gpu_seconds / self.gpu_seconds)).quantize(_CENT)


@dataclass(frozen=True)
class UsageRow:
    """One group of a report: the dimensions' values (in `Report.group_by` order) and what it used."""

    key: tuple[str, ...]
    usage: Usage


@dataclass(frozen=True)
class Report:
    """A usage report of one period: rows by `group_by`, their total, and (when asked for) a series by bucket."""

    period: Period
    group_by: tuple[str, ...]
    rows: list[UsageRow]
    total: Usage
    currency: str
    bucket: str = ""
    series: list[tuple[datetime, list[UsageRow]]] = field(default_factory=list)
