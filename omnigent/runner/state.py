"""What every part of a runner shares: its state, declared once, and how it stops.

A `Runner` (`main.py`) is put together from one mixin per concern, as the
store is: its connection (`connection.py`), the imports it pays for while
dialing and the steps that need them (`prewarm.py`), an early runner's
identity (`identity.py`). Each is a `RunnerState`, which declares the
attributes they share (`Runner.__init__` sets every one of them) and what
every phase needs to be stoppable: `request_stop` cancels the phase running
now (the connect loop, a session, the identity read, the prewarm), and
`_stoppable` opens the scope of the next one, cancelled at once when the
runner is already stopping. The process's exit codes are here too, since
several parts end with one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import trio

from protocol import Frame

from ._log import log
from .config import Config
from .outgoing import Outgoing
from .redial import Backoff
from .tool_steps import ToolSlots
from .turns import Turns

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


class RunnerState:
    """The attributes a runner's mixins share (`Runner.__init__` sets them), and stopping."""

    config: Config
    environ: Mapping[str, str]
    exit_code: int
    stopping: bool
    _active: trio.CancelScope
    _turns: Turns
    _tools: ToolSlots
    _secrets: list[str] | None
    _unsent: list[tuple[Frame, Any]] | None
    _outgoing: Outgoing
    _dial: Callable[..., Any]
    _backoff: Backoff
    _harness: ModuleType | None
    _pool: Any
    _prewarm_scope: trio.CancelScope
    _prewarmed: trio.Event
    _prewarming: bool

    # --- lifetime -------------------------------------------------------

    def request_stop(self, why: str) -> None:
        if not self.stopping:
            log(f"stopping: {why}")
        self.stopping = True
        self._active.cancel()
        self._prewarm_scope.cancel()

    def _stoppable(self) -> trio.CancelScope:
        """A fresh scope for the next phase that `request_stop` cancels (at once if already stopping)."""
        self._active = trio.CancelScope()
        if self.stopping:
            self._active.cancel()
        return self._active
