"""Session stream events as typed objects.

Every event is an `Event`: its `type`, the whole JSON payload in `data`, and
the per-session `sequence_number` the server logged it under (None for
heartbeats, which are not logged; the first heartbeat of a connection states
the session's newest number). Known types get a subclass with typed
accessors; a type this SDK does not know, or a known one missing its fields,
comes through as a plain `Event`, never as an error, so an older SDK keeps
working against a newer server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

HEARTBEAT = "session.heartbeat"
TERMINAL_TYPES = frozenset({"response.completed", "response.failed", "response.cancelled",
                            "response.incomplete"})


@dataclass(frozen=True)
class Event:
    type: str
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    sequence_number: int | None = None

    @property
    def session_id(self) -> str | None:
        return self.data.get("session_id")

    @property
    def turn_id(self) -> str | None:
        return self.data.get("turn_id")

    @property
    def is_terminal(self) -> bool:
        """True for the event that ends a turn (completed, failed, cancelled, incomplete)."""
        return self.type in TERMINAL_TYPES


class Heartbeat(Event):
    """Keep-alive. The first one on a connection carries the session's current sequence number."""


class SessionStatus(Event):
    @property
    def status(self) -> str:
        return self.data["status"]

    @property
    def error(self) -> dict[str, Any] | None:
        return self.data.get("error")


class InputConsumed(Event):
    """The user's message, as stored (it is persisted before the turn starts)."""

    @property
    def item(self) -> dict[str, Any]:
        return self.data["item"]


class ResponseCreated(Event):
    """A turn attempt started; a retried attempt starts the answer over."""

    @property
    def attempt(self) -> int:
        return self.data["attempt"]


class TextDelta(Event):
    @property
    def delta(self) -> str:
        return self.data["delta"]


class ItemDone(Event):
    @property
    def item(self) -> dict[str, Any]:
        return self.data["item"]


class ResponseCompleted(Event):
    @property
    def response(self) -> dict[str, Any]:
        return self.data["response"]


class ResponseFailed(Event):
    @property
    def error(self) -> dict[str, Any]:
        return self.data["error"]


class ResponseCancelled(Event):
    pass


class RunnerLost(Event):
    @property
    def runner_id(self) -> str:
        return self.data["runner_id"]


class RunnerRebound(Event):
    @property
    def new_runner_id(self) -> str:
        return self.data["new_runner_id"]


class TurnInterrupted(Event):
    """A turn attempt ended without an answer (its runner was lost, the server restarted)."""

    @property
    def reason(self) -> str:
        return self.data["reason"]


class TurnRetried(Event):
    """An interrupted turn runs again; `attempt` is the attempt about to start."""

    @property
    def attempt(self) -> int:
        return self.data["attempt"]


class Resync(Event):
    """Sent instead of a replay the server's log cannot give whole: a snapshot, then the events after it.

    It comes when the cursor is below what the log keeps (text deltas of old
    turns are compacted; a session older than the log), or above its newest
    number (a store that was replaced). `sequence_number` is the snapshot's
    position; the stream goes on from there. Replace what you kept of the
    session with `items` and `turns` (each turn's id, status, attempt, error).
    """

    TYPE = "session.resync"

    @property
    def reason(self) -> str:
        return self.data["reason"]

    @property
    def session(self) -> dict[str, Any] | None:
        return self.data.get("session")

    @property
    def items(self) -> list[dict[str, Any]]:
        return self.data["items"]

    @property
    def turns(self) -> list[dict[str, Any]]:
        return self.data["turns"]


class StreamReset(Event):
    """Kept for old callers: no longer yielded, since the server's log survives restarts.

    A cursor the server cannot serve now gets a `Resync` from the server.
    """

    TYPE = "client.stream_reset"

    @property
    def previous(self) -> int:
        return self.data["previous"]


# type -> (class, fields that must be present with these types for the class to apply)
_KNOWN: dict[str, tuple[type[Event], dict[str, type]]] = {
    HEARTBEAT: (Heartbeat, {}),
    "session.status": (SessionStatus, {"status": str}),
    "session.input.consumed": (InputConsumed, {"item": dict}),
    "session.runner.lost": (RunnerLost, {"runner_id": str}),
    "session.runner.rebound": (RunnerRebound, {"new_runner_id": str}),
    "response.created": (ResponseCreated, {"attempt": int}),
    "response.output_text.delta": (TextDelta, {"delta": str}),
    "response.output_item.done": (ItemDone, {"item": dict}),
    "response.completed": (ResponseCompleted, {"response": dict}),
    "response.failed": (ResponseFailed, {"error": dict}),
    "response.cancelled": (ResponseCancelled, {}),
    "session.turn.interrupted": (TurnInterrupted, {"reason": str}),
    "session.turn.retried": (TurnRetried, {"attempt": int}),
    Resync.TYPE: (Resync, {"reason": str, "items": list, "turns": list}),
}


def parse_event(data: dict[str, Any], *, event_type: str | None = None,
                event_id: str | None = None) -> Event:
    """The typed event for one payload; `event_type`/`event_id` are the SSE `event:`/`id:` lines."""
    type_: str = data["type"] if isinstance(data.get("type"), str) else event_type or "unknown"
    seq = data.get("sequence_number")
    if not isinstance(seq, int) or isinstance(seq, bool):
        seq = int(event_id) if event_id and event_id.isdigit() else None
    cls, required = _KNOWN.get(type_, (Event, {}))
    if any(not isinstance(data.get(k), t) for k, t in required.items()):
        cls = Event
    if cls is Heartbeat or type_ == HEARTBEAT:
        return Heartbeat(type_, data, seq)
    return cls(type_, data, seq)


def message_text(item: dict[str, Any]) -> str:
    """The visible text of a message item (input or output parts)."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(
        part.get("text", "") for part in content or ()
        if isinstance(part, dict) and part.get("type") in ("output_text", "input_text", "text")
    )
