"""Restart policy: capped exponential backoff with jitter, reset and intensity.

Pure code with no I/O and no clock of its own: the caller passes the times, so
the policy is unit-tested without trio and the supervisor drives it with trio's
clock (a MockClock in tests).
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    """How one child is restarted; see `RestartTracker` for the exact rules."""

    base: float = 0.1  # first delay
    factor: float = 2.0
    cap: float = 10.0
    jitter: float = 0.1  # fraction: delay * uniform(1 - jitter, 1 + jitter); 0 = deterministic
    reset_after: float = 30.0  # a run this long counts as healthy and resets the backoff
    intensity: int = 5  # more than `intensity` restarts within `period` seconds: give up
    period: float = 60.0
    forever: bool = False  # retry forever: ignore intensity

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < 0 or self.factor < 1:
            raise ValueError("RestartPolicy needs base >= 0, cap >= 0, factor >= 1")
        if not 0 <= self.jitter < 1:
            raise ValueError("RestartPolicy.jitter must be in [0, 1)")
        if self.intensity < 0 or self.period <= 0:
            raise ValueError("RestartPolicy needs intensity >= 0 and period > 0")


class RestartTracker:
    """The restart history of one child.

    `on_exit` is called once per exit that would lead to a restart:
    - a run of at least `reset_after` seconds resets the backoff to `base`;
    - the delay is `min(cap, base * factor**n)` for the n-th restart since the
      last reset, then scaled by the jitter (so it may exceed `cap` by up to
      `jitter` of it);
    - the exit is recorded; if more than `intensity` exits fall within the last
      `period` seconds (this one included) and not `forever`, it returns None:
      give up.
    """

    def __init__(self, policy: RestartPolicy, rng: random.Random | None = None) -> None:
        self.policy = policy
        self._rng = rng or random.Random()
        self._exponent = 0
        self._exits: deque[float] = deque()
        # Stop growing the exponent once the cap is reached, so factor**n never overflows.
        if policy.base <= 0 or policy.factor <= 1 or policy.cap <= policy.base:
            self._max_exponent = 0
        else:
            self._max_exponent = math.ceil(math.log(policy.cap / policy.base, policy.factor))

    def on_exit(self, started_at: float, exited_at: float) -> float | None:
        """Return the delay before the next start, or None to give up."""
        p = self.policy
        if exited_at - started_at >= p.reset_after:
            self._exponent = 0
        self._exits.append(exited_at)
        while self._exits[0] <= exited_at - p.period:
            self._exits.popleft()
        if not p.forever and len(self._exits) > p.intensity:
            return None
        delay = min(p.cap, p.base * p.factor**self._exponent)
        self._exponent = min(self._exponent + 1, self._max_exponent)
        if p.jitter:
            delay *= self._rng.uniform(1 - p.jitter, 1 + p.jitter)
        return delay
