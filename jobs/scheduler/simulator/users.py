"""What users do that no trace records: the time limit they submit with, and whether and how often they checkpoint.

Both are drawn per job from a generator seeded by the run's seed, what is
drawn and the job's id (`job_random`), so a job gets the same draw whatever
the policy, the order of events or the process, and a different `--seed`
gives another sample of the same distributions.

Time limits (`LimitModel`). Users over-estimate, and their estimates are
modal: the maximum the queue allows is the most popular value (Tsafrir,
Etsion & Feitelson, "Modeling user runtime estimates", JSSPP 2005, LNCS 3834:
about 90 % of jobs use 20 values, and giving a model only the maximum and
the share of jobs asking for it reproduces scheduling with real estimates);
the rest are far above the run time (Mu'alem & Feitelson, "Utilization,
predictability, workloads, and user runtime estimates in scheduling the IBM
SP2 with backfilling", IEEE TPDS 12(6), 2001: run time / estimate roughly
uniform; Lee et al., "Are user runtime estimates inherently inaccurate?",
JSSPP 2004: still so when killing is off). The model: `at_max_share` (17 %)
ask for the pool's maximum; the rest ask for run time x a factor
log-uniform in [`factor_low`, `factor_high`] = [1.5, 10] (median ~3.9),
capped by the maximum. A job whose run time exceeds its limit is killed
there, as the product does.

Checkpoints (`CheckpointMix`). No trace says which jobs checkpoint. The
default: 40 % of jobs checkpoint, every 15, 30 or 60 minutes (equally
likely); the rest never do. This is an assumption, not a measurement:
training scripts commonly save every N steps or each epoch, and the share
that does so on a shared research cluster is not published for these
traces. `--checkpoint-interval` and `--no-checkpoints` replace it for a
sensitivity check.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

DAY_S = 86_400.0
# Seven days: the longest partition limit common on shared GPU clusters (Slurm's own default is UNLIMITED).
DEFAULT_MAX_RUNTIME_S = 7 * DAY_S


def job_random(seed: int, job_id: str, what: str) -> random.Random:
    """Return a generator for one draw about one job: the same for the same (seed, job, what) in any process.

    A string seed is hashed with SHA-512 by `random.Random`, unaffected by
    PYTHONHASHSEED.
    """
    return random.Random(f"{seed}/{what}/{job_id}")  # noqa: S311 - a reproducible sample, not a secret


@dataclass(frozen=True, slots=True)
class LimitModel:
    """How users set a job's time limit: the pool's maximum for a share of jobs, else run time x a factor."""

    max_runtime_s: float = DEFAULT_MAX_RUNTIME_S
    at_max_share: float = 0.17
    factor_low: float = 1.5
    factor_high: float = 10.0

    def draw(self, job_id: str, run_s: float, seed: int = 0) -> float:
        """Return the limit a user submits job `job_id` (true run time `run_s`) with; never above the maximum."""
        rng = job_random(seed, job_id, "limit")
        if rng.random() < self.at_max_share:
            return self.max_runtime_s
        factor = math.exp(rng.uniform(math.log(self.factor_low), math.log(self.factor_high)))
        return min(run_s * factor, self.max_runtime_s)

    def describe(self) -> dict[str, object]:
        """Return the model as the run's JSON states it."""
        return {
            "model": "share at the maximum, else run time x log-uniform factor, capped by the maximum",
            "max_runtime_s": self.max_runtime_s,
            "at_max_share": self.at_max_share,
            "factor_range": [self.factor_low, self.factor_high],
            "killed_at_limit": "a job still running at its limit is killed there and counts as finished (failed)",
        }


@dataclass(frozen=True, slots=True)
class CheckpointMix:
    """Which jobs checkpoint and how often: `share` of them, at one of `intervals_s` (equally likely)."""

    share: float = 0.4
    intervals_s: tuple[float, ...] = (900.0, 1_800.0, 3_600.0)

    def draw(self, job_id: str, seed: int = 0) -> float:
        """Return seconds between job `job_id`'s checkpoints; 0 for a job that never checkpoints."""
        rng = job_random(seed, job_id, "checkpoint")
        if rng.random() >= self.share or not self.intervals_s:
            return 0.0
        return rng.choice(self.intervals_s)

    def describe(self) -> dict[str, object]:
        """Return the mix as the run's JSON states it."""
        return {"model": "mix", "share": self.share, "intervals_s": list(self.intervals_s)}
