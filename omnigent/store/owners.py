"""Who holds a conversation claim, and whether that process still lives.

A pid alone is not an identity: pids are reused. The kernel's start time of
the process (field 22 of /proc/<pid>/stat, clock ticks since boot) is fixed
for the life of a process, so (pid, start time) names one process for good.
Where /proc is missing the start time is "" and only the pid is checked.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field


def process_started(pid: int) -> str | None:
    """The process's start time as /proc says it, "" without /proc, None if it is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None if os.path.isdir("/proc/self") else _signal_check(pid)
    except OSError:
        return _signal_check(pid)
    if fields[0] in ("Z", "X"):
        return None  # exited, not yet reaped: gone all the same
    return fields[19]  # field 22 counted from 1, after pid and comm


def _signal_check(pid: int) -> str | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return ""


@dataclass(frozen=True)
class ClaimOwner:
    """One claimant: a process (pid + start time) and a token per turn service in it."""

    pid: int
    started: str
    token: str = field(default_factory=lambda: secrets.token_hex(8))

    @classmethod
    def this_process(cls) -> ClaimOwner:
        pid = os.getpid()
        return cls(pid, process_started(pid) or "")


def owner_alive(pid: int, started: str) -> bool:
    """True while the process that recorded (pid, started) runs; a reused pid is not it."""
    now = process_started(pid)
    if now is None:
        return False
    return not started or not now or now == started
