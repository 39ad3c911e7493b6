"""Lifecycle events and the exceptions a supervised child or a supervisor raises.

They live apart from the tree so that subscribers (the server, logs, tests) can
import the vocabulary without pulling in the supervisor machinery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Restart = Literal["permanent", "transient", "temporary"]
"""permanent: always restart; transient: restart after an abnormal exit only;
temporary: never restart."""

EventKind = Literal["starting", "running", "exited", "restarting", "gave_up", "stopping", "stopped"]


@dataclass(frozen=True)
class Event:
    """One state transition of one child, stamped with `trio.current_time()`."""

    kind: str
    child: str
    time: float
    pid: int | None = None
    code: int | None = None  # exit code when it exited on its own
    signal: int | None = None  # signal number when killed by a signal
    delay: float | None = None  # for "restarting"
    reason: str | None = None  # human text: "exited with code 3", "startup timeout", ...


@dataclass(frozen=True)
class ChildInfo:
    """A snapshot of one live child, as `Supervisor.children()` reports it."""

    name: str
    state: str  # "starting" | "running" | "restarting" | "stopping"
    pid: int | None
    restarts: int
    started_at: float | None  # trio time of the current attempt's "starting"


class ChildExited(Exception):
    """Raised by a child's run function when the child ended abnormally."""

    def __init__(
        self,
        reason: str,
        *,
        code: int | None = None,
        signal: int | None = None,
        log_tail: str = "",
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code
        self.signal = signal
        self.log_tail = log_tail


class GaveUp(Exception):
    """Raised out of `Supervisor.run` when a child restarted too often.

    `str(e)` is one line with the child and the reason of its last exit; the
    child's last log lines are in `log_tail` so the parent can show them.
    """

    def __init__(self, child: str, reason: str, log_tail: str = "") -> None:
        super().__init__(f"child {child!r} restarted too often, giving up; last exit: {reason}")
        self.child = child
        self.reason = reason
        self.log_tail = log_tail
