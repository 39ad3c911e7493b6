"""What a turn leaves behind: the runner's events relayed, and its end stored with its events.

(A completed turn's end is stored with its last model step, `agent_loop.py`.)

Every end of a turn (completed, failed, cancelled, interrupted) is written
to the store and published to the session's watchers in one hub transaction
(`hub.transaction`), so a watcher never sees an end the store does not have,
nor the reverse. A failure that cannot be stored (a full disk) is still
published: watchers hear why, and the next start marks the turn interrupted.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

import protocol as p
from protocol import events as ev

from ..store import Store
from .hub import EventHub

log = logging.getLogger("omnigent.server.turns")


class Outcomes:
    def __init__(self, store: Store, hub: EventHub) -> None:
        self.store = store
        self.hub = hub

    def relay(self, session_id: str, turn_id: str, event: dict[str, Any], *, soon: bool = False) -> None:
        """Publish one event the runner sent for this turn; a malformed one is dropped (logged).

        `soon`: more of the runner's frames wait already, so it is stored with what follows
        (`EventHub.publish_soon`) instead of in a transaction of its own."""
        try:
            event = p.decode_event({**event, "turn_id": turn_id})
        except p.ProtocolError as exc:
            log.warning("dropping bad event from runner: %s", exc.reason)
            return
        fields = {k: v for k, v in event.items() if k not in ("type", "sequence_number", "session_id")}
        if soon:
            self.hub.publish_soon(session_id, event["type"], **fields)
        else:
            self.hub.publish(session_id, event["type"], **fields)

    def interrupted(self, session_id: str, turn_id: str, reason: str) -> dict[str, Any] | None:
        """The attempt ended without an answer (its runner lost, say); the turn row as it ended."""
        with self.hub.transaction(session_id) as tx:  # watchers see it end, not "running" forever
            ended = self.store.finish_turn(turn_id, "interrupted", error=reason)
            tx.publish(ev.TURN_INTERRUPTED, turn_id=turn_id, reason=reason,
                       attempt=ended["attempt"] if ended else None)
        return ended

    def cancelled(self, session_id: str, turn_id: str) -> None:
        with self.hub.transaction(session_id) as tx:  # stored with its events (events)
            self.store.finish_turn(turn_id, "cancelled", error="cancelled")
            tx.publish(ev.CANCELLED, turn_id=turn_id)
            tx.publish(ev.SESSION_STATUS, status="idle")

    def fail(self, session_id: str, turn_id: str, code: str, message: str) -> None:
        error = {"code": code, "message": message}
        try:
            with self.hub.transaction(session_id) as tx:  # stored with its events (events)
                self.store.finish_turn(turn_id, "failed", error=message)
                tx.publish(ev.FAILED, turn_id=turn_id, error=error)
                tx.publish(ev.SESSION_STATUS, status="failed", error=error)
            return
        except sqlite3.Error as exc:  # watchers still hear why; the next start marks it interrupted
            log.error("turn %s failed (%s) and that could not be stored: %s", turn_id, message, exc)
        self.hub.publish(session_id, ev.FAILED, turn_id=turn_id, error=error)
        self.hub.publish(session_id, ev.SESSION_STATUS, status="failed", error=error)
