"""How long the remote agent waits before trying the console again: exponential back-off with full jitter."""

from __future__ import annotations

import random
from collections.abc import Callable

BASE_SECONDS = 0.5
# A console or network outage is over for the agent within about this (half on average, with the jitter):
# long enough that a thousand agents coming back spread over it, short enough that reports resume promptly.
CAP_SECONDS = 10.0
# An unknown or revoked credential will not heal by itself soon: an operator has to act. Retry slowly.
UNAUTHORIZED_CAP_SECONDS = 60.0

_jitter = random.SystemRandom()


class Backoff:
    """The waits of one retry loop: each a random share of a ceiling that doubles per failure, up to a cap.

    Full jitter (a uniform draw between 0 and the ceiling) spreads a fleet
    of agents that lost the console at the same moment, so they do not all
    come back at once. An unauthorized answer has a cap of its own
    (`unauthorized_cap`). `draw` is the random source (tests pass one that
    returns the upper bound, to read the ceilings).
    """

    def __init__(
        self,
        *,
        base: float = BASE_SECONDS,
        cap: float = CAP_SECONDS,
        unauthorized_cap: float = UNAUTHORIZED_CAP_SECONDS,
        draw: Callable[[float, float], float] = _jitter.uniform,
    ) -> None:
        self.base, self.cap, self.unauthorized_cap, self.draw = base, cap, unauthorized_cap, draw
        self.failures = 0

    def next_delay(self, *, unauthorized: bool = False) -> float:
        """Count one more failure and return the seconds to wait before the next try."""
        cap = self.unauthorized_cap if unauthorized else self.cap
        ceiling = min(cap, self.base * 2.0 ** min(self.failures, 32))
        self.failures += 1
        return self.draw(0.0, ceiling)

    def reset(self) -> None:
        """Forget the failures: the next one waits about `base` again."""
        self.failures = 0
