"""What stops a runner from outside: its parent's death (stdin EOF, G9) and SIGTERM/SIGINT."""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING

import trio

from . import _early_exit
from ._log import log

if TYPE_CHECKING:
    from .main import Runner


async def _watch_stdin(runner: Runner, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Stop at EOF on stdin: the supervisor holds the other end, so its death closes it (G9)."""
    task_status.started()
    try:
        fd = os.dup(0)
    except OSError:
        log("stdin is closed; not watching it")
        return
    try:
        stream = trio.lowlevel.FdStream(fd)
    except OSError as exc:
        os.close(fd)
        log(f"cannot watch stdin: {exc}")
        return
    _early_exit.disarm()  # the loop watches from here on
    async with stream:
        try:
            while await stream.receive_some(4096):
                pass  # nothing is said on stdin; only its end matters
        except (OSError, trio.BrokenResourceError):
            pass
    runner.request_stop("stdin closed")


async def _watch_signals(runner: Runner, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for signum in signals:
            runner.request_stop(signal.Signals(signum).name)
