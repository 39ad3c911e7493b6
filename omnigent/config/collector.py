"""The garbage collector's settings for a long-running process (the server, a runner).

Both processes import everything they will ever need at start and then
allocate, per turn, tens of thousands of short-lived containers (dicts of
events, rows, frames) that reference counting frees. CPython's defaults suit
neither: a young collection every 700 allocations ran many times per turn and
pushed survivors into older generations, and a full collection walked every
object of the start-up (quart, hypercorn, openai, the store), ~0.1 s of a
paused loop on a 2-core machine and seconds under load (`gc2` in
`$OMNIGENT_STALLS`).

`tune()` is called once a process has loaded what it runs on: `gc.freeze()`
moves those objects out of the collector's sight for good, and `THRESHOLDS`
makes the collections rarer. Garbage cycles (rare here: exceptions with their
tracebacks) wait a little longer to be freed. Measured:
- the server, over `scripts/bench_sessions.py`: its collection pauses fell
  from ~1.1 s to ~0.24 s a run, and its CPU per turn by ~15 %;
- a runner: a full collection with the SDK and the harness loaded walks
  ~86,000 objects, a ~58 ms pause (in the middle of a streamed answer, when
  it comes); after the freeze it walks only what turns left. Its CPU per turn
  did not move measurably.

A middle collection every 2 young ones (not 10), and a full one every 50
middle ones (still every 100 young ones): the long-lived state a burst of new
connections leaves (their tasks, cancel scopes, coroutines; ~70,000 objects
for ~300 streams) is walked in pieces as it ages, not in one pause. Over five
pairs of `scripts/bench_sessions.py` (2026-12-07), the server's longest middle
collection fell from 34-65 ms to 28-37 ms and the paced p99 it landed in from
+21 to +15 ms (medians); the collections' total time and the CPU per turn did
not move above the noise.

`idle_collections()`, which the server installs: once the young generation is
at `IDLE_AT` (80 % of its threshold), the collection CPython is about to run
runs when the loop next waits with nothing to do (for a model's answer, a
client's next post), not inside the turn whose allocation would have set it
off. Nine pairs of `bench_sessions.py` (2026-12-07, with and without it, three
of them in the reverse order): the lone p99 +12.4 ms against +15.5 (medians;
lower in seven pairs of nine), the paced p99 +10.9 to +13.1 against +10.9 to
+18.9 (medians +12.4 / +12.6); the p50s and the CPU per turn the same within
the noise.
"""

from __future__ import annotations

import gc
from typing import Any

__all__ = ["THRESHOLDS", "idle_collections", "tune"]

# (allocations before a young collection, young collections per middle one, middle ones per
# full one); CPython's default is (700, 10, 10), and ours was (10_000, 10, 10) until 2026-12-07
THRESHOLDS = (10_000, 2, 50)


def tune() -> None:
    """Freeze what is alive now and collect less often (idempotent: a second call freezes the rest)."""
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)


# A waiting loop collects once its young generation is this far along (CPython's own trigger is
# THRESHOLDS[0]), when nothing is due in its next IDLE_WAIT seconds.
IDLE_AT = 8_000
IDLE_WAIT = 0.005


def idle_collections() -> Any:
    """A trio Instrument that runs the collection the allocations are about to trigger while the loop
    is about to wait with nothing to run, instead of in the middle of whatever allocates next.

    The generation is the one CPython would have collected then (the oldest whose count is past its
    threshold). A loop that keeps busy collects as before, at THRESHOLDS[0]."""
    import trio

    class IdleCollections(trio.abc.Instrument):
        def before_io_wait(self, timeout: float) -> None:
            if timeout < IDLE_WAIT:
                return  # a task is runnable, or a deadline is near
            young, middle, old = gc.get_count()
            if young < IDLE_AT:
                return
            gc.collect(2 if old > THRESHOLDS[2] else 1 if middle > THRESHOLDS[1] else 0)

    return IdleCollections()
