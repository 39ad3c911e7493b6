"""What the agent loop knows of a turn: the attempt it runs and what comes next in it.

`AgentLoop` (`agent_loop.py`) and its tool steps (`loop_tools.py`) pass these
around; they live here so both read one definition and neither module holds
the other's data.

What it guarantees:
- `LoopTurn` is one attempt of a turn on one runner: everything a step needs
  (the connection, its frames, the agent spec, the conversation's settings)
  and the flags a client stops it by. Nothing in it says which step comes
  next: that is read from the store every time.
- `_Plan` is that reading (`AgentLoop._plan`): the next step's kind, number
  and call, with the rows and items it was decided from, so the step that
  follows reads none of them again.
- `_pending` derives the calls still to run from the turn's stored items
  alone (a `function_call` without its `function_call_output`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from protocol import events as ev

if TYPE_CHECKING:
    from .hub import EventHub
    from .registry import RunnerConn

OPEN = ("running", "waiting")


@dataclass
class LoopTurn:
    """One attempt of a turn on one runner: what every step needs, and how a client stops it."""

    session_id: str
    turn_id: str
    input_item_id: str | None
    attempt: int
    generation: int
    conn: RunnerConn
    frames: trio.MemoryReceiveChannel[Any]
    spec: dict[str, Any]
    conv: dict[str, Any]
    mode: str
    approval_timeout: float | None
    hub: EventHub
    adopted: bool = False              # the runner claimed its step in flight: follow it first
    begun: dict[str, Any] | None = None  # step 0, begun with this attempt (`begin_first_step`): its row
    cancel_requested: bool = False
    approval_scope: trio.CancelScope | None = None
    waiting_for: str | None = None     # the approval id it waits on
    captured: dict[str, list[str]] = field(default_factory=dict)  # call id -> output streamed so far

    @property
    def runner_id(self) -> str:
        return self.conn.runner_id

    def recovered(self, step: int, kind: str, action: str, *, reason: str, tool: str | None = None) -> None:
        fields: dict[str, Any] = {"turn_id": self.turn_id, "step": step, "kind": kind, "action": action,
                                  "reason": reason}
        if tool:
            fields["tool"] = tool
        self.hub.publish(self.session_id, ev.STEP_RECOVERED, **fields)


def _pending(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The function calls among a turn's items without an output among them, in order."""
    done = {i.get("call_id") for i in items if i.get("type") == "function_call_output"}
    return [i for i in items if i.get("type") == "function_call" and i.get("call_id") not in done]


@dataclass
class _Plan:
    """What comes next in a turn (`AgentLoop._plan`), with what was read to decide it."""

    kind: str                          # "model", "tool" or "done"
    step: int
    call: dict[str, Any] | None        # a tool step's call
    later: list[dict[str, Any]]        # the step's later calls
    items: list[dict[str, Any]]        # the turn's items, as read
    open: dict[str, Any] | None        # the open step it goes on with (its row), if any
