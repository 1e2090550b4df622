"""GPU health from samples: which faults fail a GPU, which only degrade it. Pure functions.

The XID codes follow NVIDIA's XID catalog: those listed as FATAL_XIDS need a
GPU reset or node reboot (or mean the GPU is gone), so the GPU must leave
service; DEGRADING_XIDS ask for attention but the GPU keeps working.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inventory.choices import GpuHealth

FATAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}
DEGRADING_XIDS: dict[int, str] = {
    63: "ECC page retirement or row remapping recording event",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
}


@dataclass(frozen=True)
class HealthVerdict:
    """The health a sample calls for, with the reason operators read."""

    health: GpuHealth
    reason: str


def _ecc_uncorrected(sample: dict[str, Any]) -> int:
    value = sample.get("ecc_uncorrected")
    return int(value) if isinstance(value, int | float) else 0


def assess_sample(sample: dict[str, Any]) -> HealthVerdict | None:
    """Return the verdict a sample calls for, or None when it shows nothing wrong.

    `sample` is a GpuSample as a dict. A lost GPU, a fatal XID or any
    uncorrectable ECC error fails the GPU; a degrading XID degrades it.
    """
    if sample.get("lost"):
        return HealthVerdict(GpuHealth.FAILED, "GPU has fallen off the bus (NVML reports it lost)")
    xids = [int(x) for x in sample.get("xid_events") or []]
    fatal = [x for x in xids if x in FATAL_XIDS]
    if fatal:
        return HealthVerdict(GpuHealth.FAILED, f"XID {fatal[0]}: {FATAL_XIDS[fatal[0]]}")
    uncorrected = _ecc_uncorrected(sample)
    if uncorrected > 0:
        return HealthVerdict(GpuHealth.FAILED, f"{uncorrected} uncorrectable ECC error(s)")
    degrading = [x for x in xids if x in DEGRADING_XIDS]
    if degrading:
        return HealthVerdict(GpuHealth.DEGRADED, f"XID {degrading[0]}: {DEGRADING_XIDS[degrading[0]]}")
    return None


_SEVERITY = {GpuHealth.OK: 0, GpuHealth.DEGRADED: 1, GpuHealth.FAILED: 2}


def worsens(current: GpuHealth | str, verdict: HealthVerdict | None) -> bool:
    """Return whether `verdict` is worse than `current`; health never improves from samples alone.

    A failed GPU returns to service only when an operator re-provisions its
    node and the probe finds it healthy.
    """
    return verdict is not None and _SEVERITY[verdict.health] > _SEVERITY[GpuHealth(current)]
