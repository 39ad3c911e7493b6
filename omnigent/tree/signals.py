"""The signals that end a front end, and the exit code each one gives.

Both trees (`local.run_tree`, `remote.run_remote`) end their front end the
same way on SIGTERM and SIGHUP, and on SIGINT when the front end does not own
Ctrl-C itself (the REPL does: there it cancels a turn).
"""

from __future__ import annotations

import signal

import trio

SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


class SignalExit:
    """Cancels `scope` at the first signal; `code` is then that signal's exit code (else 0)."""

    def __init__(self, scope: trio.CancelScope, *, sigint: bool) -> None:
        self.scope = scope
        self.signals = list(SIGNAL_EXIT) if sigint else [signal.SIGTERM, signal.SIGHUP]
        self.code = 0

    async def watch(self) -> None:
        with trio.open_signal_receiver(*self.signals) as received:
            async for signum in received:
                self.code = SIGNAL_EXIT[signal.Signals(signum)]
                self.scope.cancel()
                return
