"""Start-up timeline: named points of a run, appended to `$OMNIGENT_TIMELINE`.

`scripts/bench.py` sets `OMNIGENT_TIMELINE=PATH` and reads back where the
time of a cold `omnigent run -p` went (process start, socket bound, runner
spawned, hello seen, first token, answer printed, exit), so a regression
shows which segment grew. Every process of the run (CLI, runners) appends
`<name> <CLOCK_MONOTONIC seconds> <pid>` lines to the same file. With
`$OMNIGENT_TIMELINE_COUNTS` set as well (`scripts/bench_sessions.py --timeline`), a
server adds how many SQL statements and trio task steps it has made so far
(`_counts`), so a segment between two of its points says how many it took; the
timed `-p` runs of `scripts/bench.py` leave it unset, so counting costs them nothing.

Without the variable `mark` is a no-op, and importing this module costs only
`os`, which every process has already loaded: it may be imported first thing.

`time.monotonic()` is deliberate here, against the house rule of trio's
clock: it is CLOCK_MONOTONIC, one clock for the whole system on Linux, so
the points of different processes line up; and this is instrumentation that
no program logic reads, not timing of the program (trio's clock may be a
MockClock, and is per run).
"""

from __future__ import annotations

import os

ENV_VAR = "OMNIGENT_TIMELINE"
COUNTS_VAR = "OMNIGENT_TIMELINE_COUNTS"


def mark(name: str, at: float | None = None) -> None:
    """Append `<name> <monotonic seconds> <pid>` to the timeline file, if one is set.

    One `O_APPEND` write per point, so lines of concurrent processes never
    interleave. Failing to write is silent: a timeline never breaks a run.
    The counts this process keeps (`count_statement`, `count_task_steps`) follow
    as `<what>=<so far>`.

    `at`: a moment taken earlier with `stamp()`, for a point whose name was not known
    then (a route's start, before it has made the turn it names); it carries no counts,
    which are this moment's.
    """
    path = os.environ.get(ENV_VAR)
    if not path:
        return
    if at is not None:
        _append(path, f"{name} {at:.6f} {os.getpid()}\n")
        return
    import time

    counted = "".join(f" {what}={n}" for what, n in _counts.items())
    _append(path, f"{name} {time.monotonic():.6f} {os.getpid()}{counted}\n")


def stamp() -> float | None:
    """This moment, for a `mark(name, at=...)` made later, when a timeline is taken (None otherwise)."""
    if not os.environ.get(ENV_VAR):
        return None
    import time

    return time.monotonic()


# what this process counts while a counted timeline is taken: "sql", its store's statements, and
# "steps", the task steps of its trio loop; a segment between two of its marks says how many it took
_counts: dict[str, int] = {}


def counting() -> bool:
    """Whether a counted timeline is being taken, so the store and the loop should count (see `_counts`)."""
    return bool(os.environ.get(ENV_VAR) and os.environ.get(COUNTS_VAR))


def count_statement(sql: str) -> None:
    """A store connection's trace callback: one more statement (a trigger's own are its statement's part)."""
    if not sql.startswith("--"):
        _counts["sql"] = _counts.get("sql", 0) + 1


def count_task_steps() -> None:
    """Inside a trio run, while a counted timeline is taken: count the loop's task steps (each is a
    switch to a task and back to the scheduler, whose cost a profile spreads thin)."""
    if not counting() or "steps" in _counts:
        return
    import trio

    class _Steps(trio.abc.Instrument):
        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            _counts["steps"] += 1

    _counts["steps"] = 0
    trio.lowlevel.add_instrument(_Steps())


def _append(path: str, line: str) -> None:
    """One `O_APPEND` write (0600): lines of concurrent processes never interleave; failing is silent.

    The file stays open for the next line (the process's exit closes it): a server marks
    a few points and stalls per turn, and an open and a close each were two syscalls more
    per line, in the very figures the marks are taken for."""
    try:
        fd = _open.get(path)
        if fd is None:
            fd = _open[path] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        os.write(fd, line.encode())
    except OSError:
        fd = _open.pop(path, None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


_open: dict[str, int] = {}  # each file `_append` wrote, by path: its descriptor


# --- stalls: named pauses of a long-running process (scripts/bench_sessions.py) -------------

STALLS_VAR = "OMNIGENT_STALLS"
STALL_MIN = 0.001  # pauses shorter than this are not worth a line


def stalls_enabled() -> bool:
    return bool(os.environ.get(STALLS_VAR))


def stall(kind: str, seconds: float) -> None:
    """Append `<kind> <monotonic seconds at its end> <milliseconds>` to `$OMNIGENT_STALLS`.

    `kind` names what held the process (`gc0`..`gc2`: a collection of that
    generation; `commit`: an event transaction's COMMIT; `wal_checkpoint`),
    so a p99 can be matched with what happened at that moment.
    """
    path = os.environ.get(STALLS_VAR)
    if not path or seconds < STALL_MIN:
        return
    import time

    _append(path, f"{kind} {time.monotonic():.6f} {seconds * 1000:.3f}\n")


def watch_gc(who: str = "") -> bool:
    """Record every garbage collection of STALL_MIN or more as a stall (when enabled), named
    `<who>gc<generation>` (the server's have no prefix; a runner's `runner_`). Idempotent."""
    global _gc_watched
    if not stalls_enabled() or _gc_watched:
        return False
    import gc
    import time

    started = [0.0]

    def probe(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            stall(f"{who}gc{info.get('generation', '?')}", time.perf_counter() - started[0])

    gc.callbacks.append(probe)
    _gc_watched = True
    return True


_gc_watched = False
