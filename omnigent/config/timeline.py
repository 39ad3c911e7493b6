"""Start-up timeline: named points of a run, appended to `$OMNIGENT_TIMELINE`.

`scripts/bench.py` sets `OMNIGENT_TIMELINE=PATH` and reads back where the
time of a cold `omnigent run -p` went (process start, socket bound, runner
spawned, hello seen, first token, answer printed, exit), so a regression
shows which segment grew. Every process of the run (CLI, runners) appends
`<name> <CLOCK_MONOTONIC seconds> <pid>` lines to the same file. A process
whose store counts its statements (`count_statement`) adds how many it has
made so far, so a segment between two of its points says how many it took.

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


def mark(name: str) -> None:
    """Append `<name> <monotonic seconds> <pid>` to the timeline file, if one is set.

    One `O_APPEND` write per point, so lines of concurrent processes never
    interleave. Failing to write is silent: a timeline never breaks a run.
    """
    path = os.environ.get(ENV_VAR)
    if not path:
        return
    import time

    counted = "" if _statements is None else f" {_statements}"
    _append(path, f"{name} {time.monotonic():.6f} {os.getpid()}{counted}\n")


# SQL statements this process's store has made, once it counts them (`count_statements`)
_statements: int | None = None


def count_statements() -> bool:
    """Whether the store should count its statements (`count_statement`): a timeline is being taken."""
    global _statements
    if not os.environ.get(ENV_VAR):
        return False
    _statements = _statements or 0
    return True


def count_statement(sql: str) -> None:
    """A store connection's trace callback: one more statement (a trigger's own are its statement's part)."""
    global _statements
    if not sql.startswith("--") and _statements is not None:
        _statements += 1


def _append(path: str, line: str) -> None:
    """One `O_APPEND` write (0600): lines of concurrent processes never interleave; failing is silent."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        pass


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


def watch_gc() -> bool:
    """Record every garbage collection of STALL_MIN or more as a stall (when enabled). Idempotent."""
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
            stall(f"gc{info.get('generation', '?')}", time.perf_counter() - started[0])

    gc.callbacks.append(probe)
    _gc_watched = True
    return True


_gc_watched = False
