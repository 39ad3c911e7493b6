"""The process-wide child-subreaper flag, held while any runner pool runs in this process.

A runner's tools may leave daemonised processes behind (`cmd &`, `nohup`, a
double fork); when the runner itself is killed they would go to init. While
a pool runs, its process is a child subreaper (`PR_SET_CHILD_SUBREAPER`), so
they come to it and the pool sweeps them after every runner exit
(`launching.RunnerLaunches._sweep_tools`). The flag belongs to the process,
not to a pool, so pools running in one process (tests) count themselves in
and the last one out clears it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from ..tools import reaper

_subreaper_pools = 0  # pools running in this process: the subreaper flag is process-wide


@contextlib.asynccontextmanager
async def subreaper() -> AsyncIterator[None]:
    """This process is a subreaper while a pool runs in it, so a killed runner's orphaned tool
    processes come to us to be swept (see `omnigent.tools.reaper`); cleared after the last
    pool stopped its runners, so a process that hosted a pool for a while (a test) does not
    go on collecting other processes' orphans."""
    global _subreaper_pools
    if _subreaper_pools == 0:
        reaper.become_subreaper()
    _subreaper_pools += 1
    try:
        yield
    finally:
        _subreaper_pools -= 1
        if _subreaper_pools == 0:
            reaper.become_subreaper(False)
