"""The session event vocabulary that clients watch.

Names follow the OpenAI Responses streaming events plus `session.*` events of
our own. Every event is a JSON object with `type` and, once the server has
logged it, a per-session `sequence_number` (heartbeats have none, except the
greeting one, which states the session's newest number). `decode_event` checks the fields a
client relies on, so a client never renders half an event.
"""

from __future__ import annotations

from typing import Any

from .errors import ProtocolError
from .jsonobj import load_object

SESSION_STATUS = "session.status"          # status: idle|running|waiting|failed (waiting: for an approval)
HEARTBEAT = "session.heartbeat"
INPUT_CONSUMED = "session.input.consumed"  # the persisted user item
RUNNER_LOST = "session.runner.lost"        # runner_id, cause
RUNNER_REBOUND = "session.runner.rebound"  # old_runner_id, new_runner_id, cause
RUNNERS_GAVE_UP = "session.runners.gave_up"  # reason: no runner will be replaced any more
MODEL_RETRY = "session.model.retry"        # error, attempt (the next), attempts, delay (s)
RESPONSE_CREATED = "response.created"      # a turn attempt started: turn_id, attempt
TEXT_DELTA = "response.output_text.delta"
ITEM_DONE = "response.output_item.done"
COMPLETED = "response.completed"
FAILED = "response.failed"
CANCELLED = "response.cancelled"
# turn state not carried by the events above
TURN_INTERRUPTED = "session.turn.interrupted"  # turn_id, reason (its runner was lost, the server restarted)
TURN_RETRIED = "session.turn.retried"          # turn_id, attempt (the one about to start)
# the agent loop (server/agent_loop.py): a turn is model steps and tool steps
TOOL_STARTED = "session.tool.started"        # turn_id, step, call_id, tool, arguments (JSON text)
TOOL_OUTPUT = "session.tool.output"          # turn_id, call_id, delta (runner -> server, batched)
TOOL_DONE = "session.tool.completed"         # turn_id, step, call_id, tool, status, item (function_call_output)
APPROVAL_REQUESTED = "session.approval.requested"  # turn_id, approval_id, call_id, tool, arguments, step,
                                                   # target (command or path "always" covers), diff?, expires_at?
APPROVAL_RESOLVED = "session.approval.resolved"    # turn_id, approval_id, call_id, decision, by
STEP_RECOVERED = "session.step.recovered"    # turn_id, step, kind (model|tool|approval), action
                                             # (repeated|rerun|interrupted|asked_again|not_run), tool?, reason
USAGE = "session.usage"                      # turn_id, step, usage (one model step's), turn (summed so far)
# made by the server for one watcher, never stored: its cursor is below what the log keeps
# (compacted, or before the log existed) or above its newest number. A snapshot of the
# session as of `sequence_number`: its items and the state of each turn; events follow.
RESYNC = "session.resync"                      # reason, after, session, items, turns

# type -> fields that must be present (with their types)
EVENT_TYPES: dict[str, dict[str, type | tuple[type, ...]]] = {
    SESSION_STATUS: {"status": str},
    HEARTBEAT: {},
    INPUT_CONSUMED: {"item": dict},
    RUNNER_LOST: {"runner_id": str, "cause": str},
    RUNNER_REBOUND: {"old_runner_id": str, "new_runner_id": str, "cause": str},
    RUNNERS_GAVE_UP: {"reason": str},
    MODEL_RETRY: {"turn_id": str, "error": str, "attempt": int, "attempts": int, "delay": (int, float)},
    RESPONSE_CREATED: {"turn_id": str, "attempt": int},
    TEXT_DELTA: {"turn_id": str, "delta": str},
    ITEM_DONE: {"turn_id": str, "item": dict},
    COMPLETED: {"turn_id": str, "response": dict},
    FAILED: {"turn_id": str, "error": dict},
    CANCELLED: {"turn_id": str},
    TURN_INTERRUPTED: {"turn_id": str, "reason": str},
    TURN_RETRIED: {"turn_id": str, "attempt": int},
    RESYNC: {"reason": str, "items": list, "turns": list},
    TOOL_STARTED: {"turn_id": str, "step": int, "call_id": str, "tool": str, "arguments": str},
    TOOL_OUTPUT: {"turn_id": str, "call_id": str, "delta": str},
    TOOL_DONE: {"turn_id": str, "step": int, "call_id": str, "tool": str, "status": str, "item": dict},
    APPROVAL_REQUESTED: {"turn_id": str, "approval_id": str, "call_id": str, "tool": str, "arguments": str,
                         "step": int, "target": str},
    APPROVAL_RESOLVED: {"turn_id": str, "approval_id": str, "call_id": str, "decision": str, "by": str},
    STEP_RECOVERED: {"turn_id": str, "step": int, "kind": str, "action": str, "reason": str},
    USAGE: {"turn_id": str, "step": int, "usage": dict, "turn": dict},
}

TERMINAL_EVENTS = frozenset({COMPLETED, FAILED, CANCELLED})


def make_event(type_: str, **fields: Any) -> dict[str, Any]:
    event = {"type": type_, **fields}
    _check(event)
    return event


def decode_event(raw: str | bytes | dict[str, Any]) -> dict[str, Any]:
    event = raw if isinstance(raw, dict) else load_object(raw, "event")
    _check(event)
    return event


def _check(event: dict[str, Any]) -> None:
    type_ = event.get("type")
    required = EVENT_TYPES.get(type_) if isinstance(type_, str) else None
    if required is None:
        raise ProtocolError(f"unknown event type {type_!r}")
    for name, expected in required.items():
        value = event.get(name)
        if not isinstance(value, expected) or isinstance(value, bool) and expected is int:
            raise ProtocolError(f"{type_}: field {name!r} missing or mistyped")
    seq = event.get("sequence_number")
    if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool)):
        raise ProtocolError(f"{type_}: sequence_number must be an integer")
