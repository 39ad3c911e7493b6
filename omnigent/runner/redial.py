"""When a runner dials again: capped exponential backoff with jitter, on trio's clock.

A runner whose websocket drops (the server restarted, the network blinked)
does not end: it keeps its turns running and redials the same URL with the
same id and secret. The delays double from `first` up to `cap`, each one
drawn within ±`jitter` of its nominal value, so runners of one host that
lost one server do not all knock at the same instant when it comes back.
`reset()` after a connection that got as far as a hello acknowledgement.
"""

from __future__ import annotations

import random

RECONNECT_FIRST = 0.1
RECONNECT_CAP = 5.0
RECONNECT_JITTER = 0.25

# Close codes after which dialing again cannot help: the runner ends.
REFUSED = 4003                 # wrong, missing or revoked secret: the host replaces the runner
FATAL = frozenset({4000, 4002})  # we sent something malformed, or speak another protocol version


class Backoff:
    def __init__(self, *, first: float = RECONNECT_FIRST, cap: float = RECONNECT_CAP,
                 jitter: float = RECONNECT_JITTER, rng: random.Random | None = None) -> None:
        self.first, self.cap, self.jitter = first, cap, jitter
        self._rng = rng or random.Random()
        self._nominal = first

    def next(self) -> float:
        """The delay before the next dial (and the one after it grows)."""
        nominal = self._nominal
        self._nominal = min(nominal * 2, self.cap)
        return nominal * (1 + self._rng.uniform(-self.jitter, self.jitter))

    def reset(self) -> None:
        self._nominal = self.first
