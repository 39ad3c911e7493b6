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
"""

from __future__ import annotations

import gc

__all__ = ["THRESHOLDS", "tune"]

# (allocations before a young collection, young collections per middle one, middle ones per
# full one); CPython's default is (700, 10, 10)
THRESHOLDS = (10_000, 10, 10)


def tune() -> None:
    """Freeze what is alive now and collect less often (idempotent: a second call freezes the rest)."""
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
