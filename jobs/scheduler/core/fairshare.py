"""Hierarchical fair share by water-filling: guarantees first, then idle capacity by weight, capped by limits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Shares are in GPUs; anything smaller than this is rounding noise.
_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Claim:
    """One owner's claim on a capacity: its guarantee, limit, weight and current demand (running + pending GPUs)."""

    key: str
    guaranteed: float
    limit: float
    weight: float
    demand: float


def water_fill(capacity: float, claims: Sequence[Claim]) -> dict[str, float]:
    """Return each claim's fair share of `capacity`, keyed by `Claim.key`.

    Every claim first gets min(guaranteed, demand, limit). What is left is
    divided by weight among claims that want more, each capped at
    min(limit, demand); a capped claim's unused part flows to the others
    (water-filling). If the guarantees alone exceed the capacity (an
    overcommitted pool), they are scaled down proportionally.
    """
    ceilings = {claim.key: max(0.0, min(claim.limit, claim.demand)) for claim in claims}
    shares = {claim.key: min(max(0.0, claim.guaranteed), ceilings[claim.key]) for claim in claims}
    guaranteed_total = sum(shares.values())
    if guaranteed_total > capacity:
        scale = capacity / guaranteed_total if guaranteed_total else 0.0
        return {key: share * scale for key, share in shares.items()}
    remaining = capacity - guaranteed_total
    active = [c for c in claims if c.weight > 0 and ceilings[c.key] - shares[c.key] > _EPSILON]
    while remaining > _EPSILON and active:
        total_weight = sum(c.weight for c in active)
        capped = [c for c in active if ceilings[c.key] - shares[c.key] <= remaining * c.weight / total_weight]
        if not capped:
            for claim in active:
                shares[claim.key] += remaining * claim.weight / total_weight
            break
        for claim in capped:
            remaining -= ceilings[claim.key] - shares[claim.key]
            shares[claim.key] = ceilings[claim.key]
        active = [c for c in active if c not in capped]
    return shares
