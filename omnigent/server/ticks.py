"""One grid of instants on trio's clock for the server's periodic tasks.

An idle server still wakes for its periodic work: a ping to each runner and
host every `ping_interval`, the WAL checkpointer's look, the search index's
batch. Each at its own phase cost a pass of the event loop (and of the
kernel's scheduler) apiece: ~10 a second for a server with four runners.
Waking at multiples of their periods instead puts them on the same
instants, so trio runs those that coincide in one batch: an idle server
with four runners wakes ~3 times a second, its runners' pongs included
(`scripts/bench_idle.py`).

`next_tick` gives the same float for the same instant whatever the period
(multiples of 0.5, 1 and 2 are exact), so tasks with periods that divide
one another wake together.
"""

from __future__ import annotations

import math

import trio


def next_tick(now: float, every: float) -> float:
    """The first multiple of `every` on trio's clock strictly after `now`."""
    return (math.floor(now / every) + 1) * every


async def sleep_to_tick(every: float) -> None:
    """Sleep until the next multiple of `every` on trio's clock."""
    await trio.sleep_until(next_tick(trio.current_time(), every))
