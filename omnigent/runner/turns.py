"""The steps a runner runs, and owes the server an end for, across its connections.

A turn is a loop of steps that the server drives (server/agent_loop.py): a
model step is a `TurnStart(step=n)`, a tool step a `ToolStart(step=n)`. Each
runs in a task of its own, in a nursery that outlives any one connection,
under its own cancel scope (a `Cancel(turn_id)` ends only that turn's step).
Its frames go into one bounded outbox that the current connection's send
loop drains: while no connection is up they wait there (a step waits when
it is full). A step stays owed until its end frame has gone out, so a
reconnect's hello lists it (`claims`: turn id, attempt, generation, step)
and a restarted server can adopt it.

What it guarantees: every owed step ends with exactly one end frame
(`TurnCompleted` or `TurnFailed`, "cancelled" when cancelled, for a model
step; `ToolResult` for a tool step, "cancelled" with the output so far); a
crash in a step becomes its failure frame and never touches the other turns;
one step at a time per turn: a new one (another attempt, the next step)
first waits for the old one to end; the same step sent twice (same turn,
attempt, step and kind) runs once.

A step may emit its end before its task is done (a Responses stream's end
is known before its HTTP body has ended: streams.respond). That frame is
its one end: it then waits, `END_FIRST` at most, for the frame to go out
before it goes on reading; a Cancel or the turn's next step arriving
meanwhile finds it answered, and neither cuts the read short nor makes a
second end.

Histories: a model step may carry only the items after a prefix of the
session's history that this runner holds (`history_cache.py`, announced in
the hello as `history_cache`). `start` rebuilds the full history before the
step runs, so the harness always sees all of it; a prefix it does not hold
is answered with `HistoryMiss` at once, nothing run and nothing owed, and
the server sends the step again in full.
"""

from __future__ import annotations

import dataclasses
import os
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from protocol import ITEMS_IN_COMPLETED, Frame, HistoryMiss, ToolResult, ToolStart, TurnCompleted, TurnFailed, TurnStart
from protocol.history import HISTORY_CACHE

from .. import channels
from ._log import log, one_line
from .history_cache import HistoryCache
from .tool_steps import cancelled_result, crashed_result

# frames held while no connection is up (a turn waits when it is full): a long answer's deltas
OUTBOX_SIZE = 4096

Emit = Callable[[Frame], Awaitable[None]]
# how long a step that emitted its end early waits for it to go out before it goes on (reading its
# stream to the end): the send loop, not the rest of the stream, has the loop first
END_FIRST = 0.05
Start = TurnStart | ToolStart
_ENDS = (TurnCompleted, TurnFailed, ToolResult)


@dataclass
class _Turn:
    """A step this runner owes the server an end for: running, or its end not yet sent."""

    start: Start
    scope: trio.CancelScope
    done: trio.Event
    captured: list[str] = dataclasses.field(default_factory=list)  # a tool's output so far
    ended: Frame | None = None  # its end, emitted before the step's task is done (streams.respond)
    end_sent: trio.Event = dataclasses.field(default_factory=trio.Event)  # that end went out

    @property
    def kind(self) -> str:
        if isinstance(self.start, TurnStart):
            return "model"
        return "preview" if self.start.approval == "preview" else "tool"

    @property
    def key(self) -> tuple[int, int, str]:
        """What makes a step the same step again: a duplicate frame is ignored."""
        return (self.start.attempt, self.start.step, self.kind)

    def claim(self) -> dict[str, Any]:
        claim = {"turn_id": self.start.turn_id, "attempt": self.start.attempt,
                 "generation": self.start.generation, "step": self.start.step, "kind": self.kind}
        if isinstance(self.start, ToolStart):
            claim["call_id"] = self.start.call_id
        return claim


class Turns:
    """The runner's steps; `execute(start, emit, captured)` runs one and returns its end frame.

    `cancelled(start, captured)` makes the end frame of a cancelled tool step
    (the default keeps the output, without knowing any secret)."""

    def __init__(self, execute: Callable[[Start, Emit, list[str]], Awaitable[Frame]],
                 cancelled: Callable[[ToolStart, list[str]], Frame] = cancelled_result) -> None:
        self._execute = execute
        self._cancelled = cancelled
        self._running: dict[str, _Turn] = {}   # running here now
        self._owed: dict[str, _Turn] = {}      # turn id -> the attempt whose end is not yet sent
        self._outbox, self.queued = trio.open_memory_channel[tuple[Frame, "_Turn | None"]](OUTBOX_SIZE)
        self.nursery: trio.Nursery | None = None  # outlives connections: set while the runner serves
        self.histories = HistoryCache()
        # what the hello announces; OMNIGENT_HISTORY_CACHE=0: not the cache (every step comes in full);
        # ITEMS_IN_COMPLETED: a step's last items' events may come in its TurnCompleted (outgoing.py)
        self.features = [ITEMS_IN_COMPLETED]
        if os.environ.get("OMNIGENT_HISTORY_CACHE") != "0":
            self.features.insert(0, HISTORY_CACHE)

    def __len__(self) -> int:
        """How many turns are owed an end (running, or their end not yet sent)."""
        return len(self._owed)

    def claims(self) -> list[dict[str, Any]]:
        """What a hello's `in_flight` lists: each owed step's turn id, attempt, generation and step."""
        return [turn.claim() for turn in self._owed.values()]

    def start(self, start: Start) -> None:
        old = self._owed.get(start.turn_id)
        # Registered before the task runs, so a Cancel right behind it still finds it.
        turn = _Turn(start, trio.CancelScope(), trio.Event())
        if old is not None and old.key == turn.key:
            log(f"turn {start.turn_id} step {start.step} ({turn.kind}) is already running here: "
                f"duplicate {start.kind} ignored")
            return
        if old is not None and old.ended is not None:
            old = None  # it has answered and only reads its stream to the end: nothing to supersede
        if isinstance(start, TurnStart):
            try:
                full = self._full_history(start)
            except Exception as exc:  # a cache bug must not take the receive loop down: it is only a cache
                log(f"turn {start.turn_id}: the history cache failed ({one_line(exc)}); not using it")
                self.histories.drop(start.session_id)
                full = None if start.history_from else start
                if full is None:
                    self._send_soon(HistoryMiss(start.turn_id, start.attempt, start.step))
            if full is None:
                return
            turn.start = full
        self._running[start.turn_id] = self._owed[start.turn_id] = turn
        assert self.nursery is not None
        self.nursery.start_soon(self._run, turn, old)

    def _full_history(self, start: TurnStart) -> TurnStart | None:
        """The step with its whole history, from the cache when it carries only the new items.

        None: the cache does not hold the prefix named; `HistoryMiss` is on its way."""
        full = self.histories.whole(start)
        if full is None:
            log(f"turn {start.turn_id} step {start.step}: the history prefix of {start.history_from} items "
                "is not the one held here; asking for it in full")
            self._send_soon(HistoryMiss(start.turn_id, start.attempt, start.step))
        elif start.history_from:
            log(f"turn {start.turn_id} step {start.step}: {len(start.input)} new history items sent, "
                f"{start.history_from} from the cache")
        return full

    def _send_soon(self, frame: Frame) -> None:
        """Queue a frame that ends nothing (owed by no step)."""
        try:
            self._outbox.send_nowait((frame, None))
        except trio.WouldBlock:
            assert self.nursery is not None
            self.nursery.start_soon(self._outbox.send, (frame, None))

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
        """A frame from the outbox went out: once it is the step's end, nothing is owed any more."""
        if turn is not None and isinstance(frame, _ENDS):
            turn.end_sent.set()
            if self._owed.get(turn.start.turn_id) is turn:
                del self._owed[turn.start.turn_id]

    async def _run(self, turn: _Turn, superseded: _Turn | None) -> None:
        start = turn.start
        if superseded is not None:  # another attempt or step of this turn: it ends (and says so) first
            superseded.scope.cancel()
            await superseded.done.wait()
        log(f"turn {start.turn_id} step {start.step} start: session {start.session_id} attempt {start.attempt} "
            + _describe(start))
        started = trio.current_time()
        terminal: Frame | None = None
        try:
            with turn.scope:
                terminal = await self._guarded(start, turn)
            if turn.ended is not None:  # sent already, as the step's answer was known
                terminal = turn.ended
            elif turn.scope.cancel_called or terminal is None:
                terminal = (self._cancelled(start, turn.captured) if isinstance(start, ToolStart)
                            else TurnFailed(start.turn_id, "cancelled", "cancelled"))
            elapsed = trio.current_time() - started
            if isinstance(terminal, TurnFailed):
                log(f"turn {start.turn_id} failed after {elapsed:.2f} s: {terminal.code}: {terminal.message}")
            elif isinstance(terminal, ToolResult) and isinstance(start, ToolStart):
                log(f"turn {start.turn_id} step {start.step}: {start.name} {terminal.status} after {elapsed:.2f} s"
                    + (f" (exit code {terminal.exit_code})" if terminal.exit_code is not None else ""))
            else:
                log(f"turn {start.turn_id} step {start.step} completed after {elapsed:.2f} s")
            if turn.ended is None:
                await channels.send(self._outbox, (terminal, turn))
        finally:
            if self._running.get(start.turn_id) is turn:
                del self._running[start.turn_id]
            turn.done.set()

    async def _guarded(self, start: Start, turn: _Turn) -> Frame:
        async def emit(frame: Frame) -> None:
            if not isinstance(frame, _ENDS):
                await channels.send(self._outbox, (frame, turn))
                return
            # the step's end, before its task is done (streams.respond): the only end it sends
            turn.ended = frame
            if self._running.get(start.turn_id) is turn:
                del self._running[start.turn_id]  # a Cancel now finds it answered ("on the way")
            await channels.send(self._outbox, (frame, turn))
            with trio.move_on_after(END_FIRST):  # what the step does next waits for it to go out
                await turn.end_sent.wait()

        try:
            return await self._execute(start, emit, turn.captured)
        except Exception as exc:  # a bug in a turn must not take the other turns down
            log(f"turn {start.turn_id} crashed:\n{traceback.format_exc().rstrip()}")
            if isinstance(start, ToolStart):
                return crashed_result(start, exc)
            return TurnFailed(start.turn_id, "runner_error", one_line(f"{type(exc).__name__}: {exc}"))


def _describe(start: Start) -> str:
    if isinstance(start, ToolStart):
        return f"tool {start.name} call {start.call_id} approval {start.approval}"
    harness_name = start.agent.get("harness") or "openai-agents"
    return f"model {start.model!r} harness {harness_name} ({len(start.input)} input items)"
