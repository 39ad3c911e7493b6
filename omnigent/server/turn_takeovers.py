"""The turns a server takes up rather than dispatches: a dead predecessor's, and a dropped link's.

`TurnService` (turns.py) is built from this mixin and its dispatch. After a
restart (`take_over`, `omnigent server` only) the predecessor's running turns
wait for their runner to reconnect and claim them (`adoption.py`) and are
followed as if dispatched here (`_recover`); a remote runner whose link
dropped mid-turn may reconnect within the grace and claim its turn on the
new link (`_reclaim`, `reconnects.py`). Only a turn nobody claims is
dispatched again, through the same worker as any other.

What it guarantees: a claimed turn is followed, never run twice; an
unclaimed one is marked interrupted, then run again from its stored steps.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import trio

from protocol import events as ev

if TYPE_CHECKING:
    from ..store import Store
    from .adoption import Adoptions
    from .hub import EventHub
    from .outcomes import Outcomes
    from .reconnects import Reconnects
    from .registry import RunnerConn

log = logging.getLogger("omnigent.server.turns")  # the dispatcher's: its records keep the name they had


class TakeoversMixin:
    """`take_over`, `runner_reported`, `link_replaced` and the recovery of claimed turns, of `TurnService`."""

    store: Store
    hub: EventHub
    adoptions: Adoptions
    _reconnects: Reconnects
    _outcomes: Outcomes

    if TYPE_CHECKING:
        def submit(self, session_id: str) -> None: ...
        async def _wait(self, session_id: str, waiting: Any) -> bool: ...
        async def _follow(self, session_id: str, turn_id: str, conn: RunnerConn,
                          frames: trio.MemoryReceiveChannel[Any], *, adopted: bool = True,
                          conv: dict[str, Any] | None = None, turn: dict[str, Any] | None = None) -> str: ...
        async def _run_turn(self, session_id: str, turn: dict[str, Any],
                            losses: list[float] | None = None) -> None: ...

    def take_over(self, alive_pid_check: Callable[[int], bool]) -> list[dict[str, Any]]:
        """At start: take up the turns of a dead predecessor sharing this store (returns them).

        Running ones wait for their runner to claim them (within the adoption
        grace); queued ones simply run. A live process's turns are its own.
        """
        taken = self.store.take_over_orphaned_turns(alive_pid_check, os.getpid())
        for turn in taken:
            if turn["status"] == "running":
                # a runner of the dead server's own in-process host died with it (stdin EOF): no wait
                gone = self._reconnects.died_with_its_server(turn["runner_id"])
                self.adoptions.expect(turn, grace=0.0 if gone else None)
        for session_id in {turn["conversation_id"]: None for turn in taken}:
            self.submit(session_id)
        return taken

    async def _reclaim(self, session_id: str, turn_id: str,
                       conn: RunnerConn) -> tuple[RunnerConn, trio.MemoryReceiveChannel[Any]] | Literal["cancelled"] | None:
        """A remote runner's link dropped mid-turn: its reconnect within the grace, claiming the turn.

        Called with no checkpoint since the loss was seen (`reconnects.py`).
        "cancelled": a client interrupted the wait.
        """
        if not self._reconnects.expect(turn_id, conn.runner_id):
            return None
        claimed: list[tuple[RunnerConn, trio.MemoryReceiveChannel[Any]]] = []

        async def wait() -> None:
            got = await self._reconnects.wait(turn_id, conn.runner_id)
            if got is not None:
                claimed.append(got)

        if not await self._wait(session_id, wait()):  # interrupted meanwhile: the caller ends the turn
            return "cancelled"
        if claimed:
            log.info("turn %s: runner %s reconnected and claimed it; no new attempt", turn_id, conn.runner_id)
        return claimed[0] if claimed else None

    def link_replaced(self, old: RunnerConn) -> None:
        """A reconnect replaces a silent connection of a runner: its turns are expected on the new one."""
        self._reconnects.link_replaced(old)

    def runner_reported(self, conn: RunnerConn, in_flight: list[dict[str, Any]]) -> list[str]:
        """A runner said hello with turns in flight: adopt the expected ones; the rest it must cancel."""
        return self.adoptions.claim(conn, in_flight) if in_flight else []

    def _adopted_turn(self, session_id: str) -> dict[str, Any] | None:
        """A running turn taken over at start, waiting for its runner (it goes before the queue)."""
        if not self.adoptions.expects_session(session_id):  # the usual case: no read at all
            return None
        turn = self.store.running_own_turn(session_id, os.getpid())
        return turn if turn is not None and self.adoptions.expects(turn["id"]) else None

    async def _recover(self, session_id: str, turn: dict[str, Any]) -> None:
        """A turn of a dead predecessor: follow it if its runner claims it in time, else run it again."""
        turn_id = turn["id"]
        losses: list[float] = []
        claimed = await self.adoptions.wait(turn_id)
        if claimed is not None:
            conn, frames = claimed
            self.hub.publish(session_id, ev.SESSION_STATUS, status="running", turn_id=turn_id)
            outcome = await self._follow(session_id, turn_id, conn, frames)
            if outcome == "moved":  # rebound by hand while followed: the new binding runs it, at no loss
                self.store.finish_turn(turn_id, "interrupted", error="the session was moved to another runner")
                await self._run_turn(session_id, turn, losses)
                return
            if outcome != "lost":
                return
            losses.append(trio.current_time())
            why = f"runner {conn.runner_id} was lost"
        else:
            why = "no runner claimed it after the server restarted"
            log.warning("turn %s: %s within %g s; dispatching it again", turn_id, why, self.adoptions.grace)
        self._outcomes.interrupted(session_id, turn_id, why)
        await self._run_turn(session_id, turn, losses)
