"""The runner process: dial the server, say hello, serve turns until told to stop.

A runner holds no durable state; each TurnStart carries everything it needs
(or only the new items of a history its cache holds: turns.py, history_cache.py).
What this module owns is the process's lifetime: its entry point (`main`,
which `python -m omnigent.runner` calls), and `run`, which watches stdin and
signals from the start and exits promptly and cleanly when stdin reaches EOF
(a dead supervisor leaves no orphan, G9) or on SIGTERM (`watch.py`). The
turns themselves (one task per step with its own cancel scope, what is still
owed an end) are `turns.py`'s.

`Runner` is put together from one mixin per concern over the state they
share (`state.py`): connecting, with patience while the server starts, the
hello, the frame loops and dialing again after a drop (`connection.py`, the
frames' codec in `frames.py`); the openai and tools imports paid while it
dials, and the steps that need them (`prewarm.py`); an early runner's
identity, read from a pipe before it dials (`identity.py`).

Top-level imports stay at trio, trio_websocket (and the wsproto it imports),
protocol and the standard library; openai is imported in a worker thread
(`prewarm.py`).
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Callable, Mapping
from typing import Any

import trio

from ._log import log
from .config import Config, ConfigError, load_config  # noqa: F401  (their home before)
from .connection import DISCONNECT_TIMEOUT, HARNESSES, ConnectionMixin, dial_websocket  # noqa: F401  (HARNESSES: its home before)
from .identity import IDENTITY_FD_VAR, PENDING, IdentityMixin
from .outgoing import Outgoing
from .prewarm import PrewarmMixin
from .redial import Backoff
from .state import EXIT_ERROR, EXIT_OK, EXIT_USAGE  # noqa: F401  (EXIT_ERROR: its home before)
from .tool_steps import ToolSlots
from .turns import Turns
from .watch import _watch_signals, _watch_stdin


class Runner(ConnectionMixin, PrewarmMixin, IdentityMixin):
    """The runner's state across connections: its turns, the frames they send, the clients.

    Turns outlive a connection (`turns.py`): they put their frames in one
    outbox that the current connection's send loop drains, and the frame
    whose send failed is sent first on the next connection, so the server
    sees every frame of an adopted turn.
    """

    def __init__(self, config: Config, environ: Mapping[str, str] = os.environ, *,
                 dial: Callable[..., Any] | None = None, rng: random.Random | None = None) -> None:
        self.config = config
        self.environ = environ
        self.exit_code = EXIT_OK
        self.stopping = False
        # What `request_stop` cancels: the connect loop, then the session.
        self._active = trio.CancelScope()
        self._turns = Turns(self._execute, self._cancelled_tool)
        self._tools = ToolSlots()
        self._secrets = None  # known once the tools package is loaded
        self._unsent = None  # the frames whose write failed: first on the next connection
        self._outgoing = Outgoing(self._turns.queued)  # the outbox as the send loop reads it
        self._dial = dial or dial_websocket
        self._backoff = Backoff(rng=rng)
        self._harness = None
        self._pool = None
        self._prewarm_scope = trio.CancelScope()
        self._prewarmed = trio.Event()  # the prewarm thread is done (or failed, or was abandoned)
        self._prewarming = False

    # --- lifetime -------------------------------------------------------

    async def connect_and_serve(self) -> int:
        """Dial, serve, and dial again after a drop, until stopped or refused; the exit code."""
        async with trio.open_nursery() as turns:
            self._turns.nursery = turns
            try:
                return await self._connect_loop()
            finally:
                turns.cancel_scope.cancel()

    async def aclose(self) -> None:
        if self._pool is not None:
            with trio.move_on_after(DISCONNECT_TIMEOUT) as scope:
                scope.shield = True
                await self._pool.aclose()
        if self._secrets is not None:  # tools were loaded: nothing they started may outlive us
            await self._tools.sweep()


async def run(config: Config | None, environ: Mapping[str, str] = os.environ) -> int:
    """Serve until stopped; `config` None: an early runner, which reads it from its identity pipe."""
    runner = Runner(config or PENDING, environ)
    async with trio.open_nursery() as nursery:
        await nursery.start(_watch_signals, runner)
        await nursery.start(_watch_stdin, runner)
        nursery.start_soon(runner.prewarm)  # in a thread: stdin EOF or SIGTERM stops us even mid-import
        code: int | None = None
        if config is None:
            code = await runner.receive_identity(int(environ[IDENTITY_FD_VAR]))
        if code is None:
            log(f"started pid {os.getpid()}, server {runner.config.server_url}")
            try:
                code = await runner.connect_and_serve()
            finally:
                await runner.aclose()
            log(f"exiting with code {code}")
        nursery.cancel_scope.cancel()
    assert code is not None
    return code


def main() -> int:
    config: Config | None = None
    if os.environ.get(IDENTITY_FD_VAR, "").isdigit():
        pass  # an early runner: its config comes on that pipe
    else:
        try:
            config = load_config(os.environ)
        except ConfigError as exc:
            print(f"omnigent runner: {exc}", file=sys.stderr)
            return EXIT_USAGE
    return trio.run(run, config)
