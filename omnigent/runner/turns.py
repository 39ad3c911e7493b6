"""The turns a runner runs, and owes the server an end for, across its connections.

Each `TurnStart` runs in a task of its own, in a nursery that outlives any
one connection, under its own cancel scope (a `Cancel` ends only that turn).
Its frames go into one bounded outbox that the current connection's send
loop drains: while no connection is up they wait there (a turn waits when
it is full). A turn stays owed until its end frame has gone out, so a
reconnect's hello lists it (`claims`) and a restarted server can adopt it.

What it guarantees: every owed turn ends with exactly one end frame
(`TurnCompleted` or `TurnFailed`, "cancelled" when cancelled); a crash in a
turn becomes its `TurnFailed("runner_error")` and never touches the other
turns; a new attempt of a turn first waits for the old one to end.
"""

from __future__ import annotations

import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from protocol import Frame, TurnCompleted, TurnFailed, TurnStart

from ._log import log, one_line

# frames held while no connection is up (a turn waits when it is full): a long answer's deltas
OUTBOX_SIZE = 4096

Emit = Callable[[Frame], Awaitable[None]]


@dataclass
class _Turn:
    """A turn this runner owes the server an end for: running, or its end not yet sent."""

    start: TurnStart
    scope: trio.CancelScope
    done: trio.Event

    def claim(self) -> dict[str, Any]:
        return {"turn_id": self.start.turn_id, "attempt": self.start.attempt, "generation": self.start.generation}


class Turns:
    """The runner's turns; `execute(start, emit)` runs one with the harness and returns its end frame."""

    def __init__(self, execute: Callable[[TurnStart, Emit], Awaitable[Frame]]) -> None:
        self._execute = execute
        self._running: dict[str, _Turn] = {}   # running here now
        self._owed: dict[str, _Turn] = {}      # turn id -> the attempt whose end is not yet sent
        self._outbox, self.queued = trio.open_memory_channel[tuple[Frame, "_Turn | None"]](OUTBOX_SIZE)
        self.nursery: trio.Nursery | None = None  # outlives connections: set while the runner serves

    def __len__(self) -> int:
        """How many turns are owed an end (running, or their end not yet sent)."""
        return len(self._owed)

    def claims(self) -> list[dict[str, Any]]:
        """What a hello's `in_flight` lists: each owed turn's id, attempt and generation."""
        return [turn.claim() for turn in self._owed.values()]

    def start(self, start: TurnStart) -> None:
        old = self._owed.get(start.turn_id)
        if old is not None and old.start.attempt == start.attempt:
            log(f"turn {start.turn_id} is already running here: duplicate turn.start ignored")
            return
        # Registered before the task runs, so a Cancel right behind it still finds it.
        turn = _Turn(start, trio.CancelScope(), trio.Event())
        self._running[start.turn_id] = self._owed[start.turn_id] = turn
        assert self.nursery is not None
        self.nursery.start_soon(self._run, turn, old)

    def cancel(self, turn_id: str) -> None:
        turn = self._running.get(turn_id)
        if turn is not None:
            log(f"turn {turn_id} cancel requested")
            turn.scope.cancel()
        elif turn_id in self._owed:
            log(f"cancel for turn {turn_id}, which has ended here: its end is on the way")
        else:
            log(f"cancel for turn {turn_id}, which is not running here: ignored")

    def sent(self, frame: Frame, turn: _Turn | None) -> None:
        """A frame from the outbox went out: once it is the turn's end, nothing is owed any more."""
        if turn is not None and isinstance(frame, (TurnCompleted, TurnFailed)) \
                and self._owed.get(turn.start.turn_id) is turn:
            del self._owed[turn.start.turn_id]

    async def _run(self, turn: _Turn, superseded: _Turn | None) -> None:
        start = turn.start
        if superseded is not None:  # another attempt of this turn: it ends (and says so) first
            superseded.scope.cancel()
            await superseded.done.wait()
        harness_name = start.agent.get("harness") or "openai-agents"
        log(f"turn {start.turn_id} start: session {start.session_id} attempt {start.attempt} "
            f"model {start.model!r} harness {harness_name} ({len(start.input)} input items)")
        started = trio.current_time()
        terminal: Frame | None = None
        try:
            with turn.scope:
                terminal = await self._guarded(start, turn)
            if turn.scope.cancel_called or terminal is None:
                terminal = TurnFailed(start.turn_id, "cancelled", "cancelled")
            elapsed = trio.current_time() - started
            if isinstance(terminal, TurnFailed):
                log(f"turn {start.turn_id} failed after {elapsed:.2f} s: {terminal.code}: {terminal.message}")
            else:
                log(f"turn {start.turn_id} completed after {elapsed:.2f} s")
            await self._outbox.send((terminal, turn))
        finally:
            if self._running.get(start.turn_id) is turn:
                del self._running[start.turn_id]
            turn.done.set()

    async def _guarded(self, start: TurnStart, turn: _Turn) -> Frame:
        async def emit(frame: Frame) -> None:
            await self._outbox.send((frame, turn))

        try:
            return await self._execute(start, emit)
        except Exception as exc:  # a bug in a turn must not take the other turns down
            log(f"turn {start.turn_id} crashed:\n{traceback.format_exc().rstrip()}")
            return TurnFailed(start.turn_id, "runner_error", one_line(f"{type(exc).__name__}: {exc}"))
