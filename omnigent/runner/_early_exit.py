"""Exit at once if the parent dies before the runner's trio loop watches stdin.

Importing trio and trio_websocket takes 0.2-0.8 s on a loaded machine, before
any trio task can watch stdin. Until then a SIGIO handler does it: stdin (the
pipe whose other end the supervisor holds) is set to signal on every change,
and the handler exits when a read finds EOF. Python runs signal handlers
between bytecodes, so this works in the middle of an import. Standard library
only, imported first by `__main__`; `disarm` hands over to the trio watcher.
"""

from __future__ import annotations

import fcntl
import os
import signal
import stat

from ._log import log

_armed_flags: int | None = None  # stdin's flags before arming; None when not armed


def arm() -> None:
    """Only for a pipe on stdin (the supervisor's): a terminal's flags are not ours to change."""
    global _armed_flags
    try:
        if not stat.S_ISFIFO(os.fstat(0).st_mode):
            return
        flags = fcntl.fcntl(0, fcntl.F_GETFL)
        signal.signal(signal.SIGIO, _on_sigio)
        fcntl.fcntl(0, fcntl.F_SETOWN, os.getpid())
        fcntl.fcntl(0, fcntl.F_SETFL, flags | os.O_ASYNC | os.O_NONBLOCK)
    except (OSError, ValueError):
        return
    _armed_flags = flags
    _on_sigio()  # the parent may have died before we armed


def disarm() -> None:
    """The trio loop watches stdin from now on; no more SIGIO (its default action would kill us)."""
    global _armed_flags
    if _armed_flags is None:
        return
    try:
        flags = fcntl.fcntl(0, fcntl.F_GETFL)
        fcntl.fcntl(0, fcntl.F_SETFL, flags & ~os.O_ASYNC)
    except OSError:
        pass
    signal.signal(signal.SIGIO, signal.SIG_IGN)
    _armed_flags = None


def _on_sigio(*_: object) -> None:
    try:
        data = os.read(0, 4096)  # nothing is said on stdin; only its end matters
    except OSError:  # BlockingIOError: not at EOF, just woken
        return
    if data == b"":
        try:
            log("stopping: stdin closed (while starting)")
        except Exception:
            pass
        os._exit(0)
