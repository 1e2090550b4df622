"""Decayed historical usage per owner, as Slurm's fair share keeps it (PriorityDecayHalfLife).

Each GPU-second used at time t counts 2^(-(now - t) / half_life) at `now`.
Per owner (a tenant's total, and each of its projects, per pool) the books
hold the decayed total at the owner's last change and the GPUs it holds now.
Between changes the total follows a closed form, so nothing is integrated
step by step and a snapshot costs O(owners): with rate g GPUs held over dt,

    U(t + dt) = U(t) * d + g * h / ln 2 * (1 - d),  d = 2^(-dt / h).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jobs.scheduler.core import OwnerUsage, Workload

# (pool, tenant, project or None for the tenant's total).
Owner = tuple[str, str, str | None]


@dataclass(slots=True)
class _Account:
    gpu_seconds: float = 0.0
    at: float = 0.0
    gpus: int = 0


class UsageBooks:
    """Each owner's decayed GPU-seconds, running work included, with half-life `half_life_s` (> 0).

    Time only moves forward: every call's `now` is at or after the previous one's (an earlier one is taken
    as the latest seen).
    """

    def __init__(self, half_life_s: float) -> None:
        if half_life_s <= 0:
            raise ValueError("the usage half-life must be positive")
        self.half_life_s = half_life_s
        self._accounts: dict[Owner, _Account] = {}

    def _advance(self, account: _Account, now: float) -> None:
        dt = now - account.at
        if dt <= 0:
            return
        decay = 2.0 ** (-dt / self.half_life_s)
        held = account.gpus * self.half_life_s / math.log(2) * (1.0 - decay)
        account.gpu_seconds = account.gpu_seconds * decay + held
        account.at = now

    def _change(self, workload: Workload, now: float, sign: int) -> None:
        for owner in ((workload.pool, workload.tenant, None), (workload.pool, workload.tenant, workload.project)):
            account = self._accounts.get(owner)
            if account is None:
                account = self._accounts[owner] = _Account(at=now)
            self._advance(account, now)
            account.gpus += sign * workload.total_gpus

    def started(self, workload: Workload, now: float) -> None:
        """Start counting `workload`'s GPUs for its tenant and project from `now`."""
        self._change(workload, now, 1)

    def stopped(self, workload: Workload, now: float) -> None:
        """Stop counting `workload`'s GPUs from `now` (it finished, was killed or preempted)."""
        self._change(workload, now, -1)

    def gpu_seconds(self, owner: Owner, now: float) -> float:
        """Return `owner`'s decayed usage at `now` (0 for an owner never seen)."""
        account = self._accounts.get(owner)
        if account is None:
            return 0.0
        self._advance(account, now)
        return account.gpu_seconds

    def snapshot(self, now: float) -> tuple[OwnerUsage, ...]:
        """Return every owner's decayed usage at `now`, as the core reads it (owners at zero left out)."""
        found = []
        for (pool, tenant, project), account in self._accounts.items():
            self._advance(account, now)
            if account.gpu_seconds > 0:
                found.append(OwnerUsage(pool, tenant, project, account.gpu_seconds))
        return tuple(found)
