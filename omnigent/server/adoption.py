"""Turns a runner may still be running for this server, waiting for it to say so.

When a server process dies mid-turn, the runner does not: it keeps the
model's stream going, buffers what it would have sent and redials (see
`omnigent/runner/connection.py` and `turns.py`). The restarted server takes over its dead
predecessor's running turns (`Store.take_over_orphaned_turns`) and `expect`s
each one here for a grace (`OMNIGENT_ADOPT_GRACE`, 10 s). A reconnecting
runner lists what it still owes in `Hello.in_flight`; `claim` adopts each
entry whose turn is expected and whose runner, attempt and ownership
generation all match what the store says, by opening that turn's route on
the new connection before any of its frames are read, so the buffered ones
land there too and the answer is stored once. A claim names the step it
runs (a model step or a tool step of the agent loop): only the turn's
running step is adopted, and the loop then follows it to its end
(`agent_loop.py`), a tool's result stored once like an answer. Every other entry (an ended
turn, another attempt, a session that has moved on: a late result) is
refused: the runner is told to cancel it, and the connection drops whatever
else it sends for that turn (`serve_runner`'s draining set).

A turn that nobody claims within its grace is dispatched again by the turn
service, as a new attempt: the model is never called twice for one attempt
just because the server restarted.

The same holds while the server lives: when the link of a runner that
outlives it (a host daemon's, or an explicit one) drops mid-turn, the turn
is expected for `reconnect_grace` s, unless the runner's host reports the
process gone first.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import trio

from ..store import Store
from .registry import RunnerConn

log = logging.getLogger("omnigent.server.adoption")


@dataclass
class _Expected:
    turn_id: str
    session_id: str
    runner_id: str | None
    attempt: int
    generation: int
    deadline: float
    claimed: trio.Event = field(default_factory=trio.Event)
    conn: RunnerConn | None = None
    frames: trio.MemoryReceiveChannel[Any] | None = None


class Adoptions:
    def __init__(self, store: Store, grace: float) -> None:
        self.store = store
        self.grace = grace
        self._expected: dict[str, _Expected] = {}

    def expect(self, turn: dict[str, Any], *, grace: float | None = None) -> None:
        """Hold a running turn for its runner to claim, for `grace` s from now."""
        self._expected[turn["id"]] = _Expected(
            turn["id"], turn["conversation_id"], turn.get("runner_id"), int(turn["attempt"]),
            int(turn.get("generation") or 0), trio.current_time() + (self.grace if grace is None else grace))

    def expects(self, turn_id: str) -> bool:
        return turn_id in self._expected

    def expects_session(self, session_id: str) -> bool:
        """A turn of this session waits for its runner: leave the session's binding alone meanwhile."""
        return any(e.session_id == session_id for e in self._expected.values())

    def claim(self, conn: RunnerConn, in_flight: list[dict[str, Any]]) -> list[str]:
        """Adopt what matches of a hello's `in_flight`; returns the turn ids the runner must cancel."""
        refused: list[str] = []
        for entry in in_flight:
            turn_id = entry.get("turn_id")
            if not isinstance(turn_id, str):
                continue  # not a turn: nothing to cancel either
            why = self._mismatch(conn, turn_id, entry)
            if why is None:
                expected = self._expected[turn_id]
                expected.conn, expected.frames = conn, conn.open_turn(turn_id)
                expected.claimed.set()
                log.info("runner %s: adopted turn %s (attempt %d, generation %d)",
                         conn.runner_id, turn_id, expected.attempt, expected.generation)
            else:
                log.warning("runner %s: refused its turn %s: %s; told to cancel it", conn.runner_id, turn_id, why)
                refused.append(turn_id)
        return refused

    def _mismatch(self, conn: RunnerConn, turn_id: str, entry: dict[str, Any]) -> str | None:
        expected = self._expected.get(turn_id)
        if expected is None:
            return "no turn of this server waits for it"
        if expected.conn is not None:
            return "already adopted on another connection"
        if trio.current_time() > expected.deadline:
            return "its grace ran out"
        if expected.runner_id != conn.runner_id:
            return f"it was dispatched to {expected.runner_id}"
        if entry.get("attempt") != expected.attempt:
            return f"attempt {entry.get('attempt')!r} is not the current attempt {expected.attempt}"
        conv = self.store.get_conversation(expected.session_id) or {}
        current = int(conv.get("generation") or 0)
        if entry.get("generation") != expected.generation or current != expected.generation:
            return (f"generation {entry.get('generation')!r} is not the session's generation {current}"
                    " (the session has moved on)")
        return self._step_mismatch(turn_id, entry)

    def _step_mismatch(self, turn_id: str, entry: dict[str, Any]) -> str | None:
        """A claim names the step it runs (the agent loop's): it must be the turn's running one."""
        step = entry.get("step")
        if step is None:
            return None  # a runner of the previous protocol: one step per turn
        steps = self.store.steps(turn_id)
        running = [s["step"] for s in steps if s["status"] == "running"]
        if step not in running:
            return f"step {step!r} is not the turn's running step {running[-1] if running else None!r}"
        return None

    async def wait(self, turn_id: str) -> tuple[RunnerConn, trio.MemoryReceiveChannel[Any]] | None:
        """The connection that claimed the turn, or None when its grace ran out first."""
        expected = self._expected[turn_id]
        try:
            with trio.move_on_at(expected.deadline):
                await expected.claimed.wait()
            if expected.conn is None or expected.frames is None:
                return None
            return expected.conn, expected.frames
        finally:
            del self._expected[turn_id]
