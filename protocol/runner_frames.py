"""The frames of the runner<->server link (`/v1/runners/{runner_id}/ws`): hello, turns, tools, cancel.

A runner is stateless: each `TurnStart` or `ToolStart` carries everything the
step needs, and the runner streams `TurnEvent`s and ends each with one
`TurnCompleted`, `TurnFailed` or `ToolResult`. The fields added without a
version bump have defaults, and the codec leaves them out at their default,
so a peer of before them still reads the frame. `RUNNER_FRAMES` lists every
class here for the codec's registry.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from .frame import Frame


@dataclass(frozen=True)
class Hello(Frame):
    """Runner -> server, first frame: who I am and what I can run.

    `in_flight` lists the turns this runner still owes an end for, after a
    reconnect (the server restarted, the link dropped): `{"turn_id",
    "attempt", "generation"}` each. The server adopts those whose attempt
    and generation still match and sends `Cancel` for every other one.
    """

    kind: ClassVar[str] = "hello"
    runner_id: str
    pid: int
    protocol_version: int
    harnesses: list[str]
    in_flight: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # what this runner can do beyond the version's baseline: "history_cache" (protocol/history.py):
    # it keeps each session's last history, so a TurnStart may carry only the new items
    features: list[str] = dataclasses.field(default_factory=list)


# A Hello feature the server acknowledges (`HelloAck.features`): the runner may leave out the
# `response.output_item.done` events of a step's last items and send them only in its
# `TurnCompleted` (`unannounced`), and the server publishes those events from it. One
# websocket message less a turn each way, for the events watchers see in the same order.
ITEMS_IN_COMPLETED = "items_in_completed"
# The features a server may acknowledge. Only these are echoed: a runner that predates
# `HelloAck.features` never asks for one, so its acknowledgement carries no field it refuses.
ACKNOWLEDGED_FEATURES = frozenset({ITEMS_IN_COMPLETED})


@dataclass(frozen=True)
class HelloAck(Frame):
    """Server -> runner: accepted; ping every `ping_interval` seconds.

    `features`: those of the hello's that this server acts on (of `ACKNOWLEDGED_FEATURES`)."""

    kind: ClassVar[str] = "hello.ack"
    ping_interval: float
    features: list[str] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class TurnStart(Frame):
    """Server -> runner: run one model call with everything it needs (runners are stateless)."""

    kind: ClassVar[str] = "turn.start"
    turn_id: str
    session_id: str
    attempt: int
    agent: dict[str, Any]
    input: list[dict[str, Any]]
    model: str
    reasoning_effort: str | None = None
    # the session's ownership generation at dispatch: a runner reports it back in
    # `Hello.in_flight`, and a report from a session that has moved on is refused
    generation: int = 0
    # which model step of the turn this call is (0, 1, ...): a turn is a loop of model
    # steps and tool steps (server/agent_loop.py); `input` holds the earlier steps' items
    step: int = 0
    # the session's workspace on the runner's host; None: no file or shell tools (the
    # model is told why). The tools offered are `agent["tools"]`.
    workspace: str | None = None
    # incremental history (a runner whose hello announced "history_cache"): `input` holds the
    # items after the first `history_from`, which the runner takes from its own copy of this
    # session's history when that prefix's hash chain link (protocol/history.py, hex) is
    # `history_hash`; otherwise it answers `HistoryMiss` and the server sends the step in full.
    # 0: `input` is the whole history.
    history_from: int = 0
    history_hash: str = ""


@dataclass(frozen=True)
class HistoryMiss(Frame):
    """Runner -> server: that TurnStart's `history_from` prefix is not (or no longer) the one it
    holds; nothing ran, no model was called. The server sends the same step again in full."""

    kind: ClassVar[str] = "history.miss"
    turn_id: str
    attempt: int
    step: int


@dataclass(frozen=True)
class TurnEvent(Frame):
    """Runner -> server: one streaming event of a turn (Responses vocabulary)."""

    kind: ClassVar[str] = "turn.event"
    turn_id: str
    event: dict[str, Any]


@dataclass(frozen=True)
class TurnCompleted(Frame):
    """Runner -> server: the model's answer to one step, its `output` items as the endpoint gave them.

    `unannounced`: how many of the last items of `output` had no `response.output_item.done`
    event sent (a runner whose hello the server acknowledged with `ITEMS_IN_COMPLETED`); the
    server publishes theirs as it stores the step."""

    kind: ClassVar[str] = "turn.completed"
    turn_id: str
    response_id: str
    output: list[dict[str, Any]]
    usage: dict[str, Any] | None = None
    unannounced: int = 0

    def unannounced_items(self) -> list[dict[str, Any]]:
        """The last `unannounced` items of `output` (as many as there are): those whose event the
        runner left to this frame, for the server to publish (or a runner to send again)."""
        return self.output[len(self.output) - min(max(self.unannounced, 0), len(self.output)):]


@dataclass(frozen=True)
class TurnFailed(Frame):
    """Runner -> server: the turn ended without an answer; `output` is a partial one to keep
    (e.g. the items and text streamed before the connection dropped), stored as it is."""

    kind: ClassVar[str] = "turn.failed"
    turn_id: str
    code: str
    message: str
    output: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class ToolStart(Frame):
    """Server -> runner: run one tool call of a turn's step, in the session's workspace.

    `arguments` is the JSON text exactly as the model produced it. `approval`
    says why it may run: "read_only" (a tool without side effects), "auto"
    (the effective mode is auto), "user" (a person approved it, once or
    always), or "preview" (do nothing; answer with the diff a write_file or
    edit_file would make, status "preview"). The runner enforces its host's own
    policy on top (OMNIGENT_TOOL_POLICY): a side-effecting call under "auto"
    on a host that is not auto, or any side-effecting call on a deny host, is
    refused (status "refused"). Runs under the turn's id: one thing at a time
    per turn, and `Cancel(turn_id)` stops it (status "cancelled").
    """

    kind: ClassVar[str] = "tool.start"
    turn_id: str
    session_id: str
    attempt: int
    step: int
    call_id: str
    name: str
    arguments: str
    approval: str
    timeout_s: float
    workspace: str | None = None
    generation: int = 0


@dataclass(frozen=True)
class ToolResult(Frame):
    """Runner -> server: a tool call's end. `output` is what the model sees: capped,
    secrets redacted, with a note when it was cut. Output streamed before it came as
    `session.tool.output` turn events.

    status: "completed" (ran; a non-zero exit is still completed, see `exit_code`),
    "error" (bad arguments, a path outside the workspace, a failed edit: the model is
    told why), "timeout", "cancelled", "refused" (the host's policy), "preview".
    """

    kind: ClassVar[str] = "tool.result"
    turn_id: str
    call_id: str
    status: str
    output: str
    exit_code: int | None = None


TOOL_STATUSES = frozenset({"completed", "error", "timeout", "cancelled", "refused", "preview"})


@dataclass(frozen=True)
class Cancel(Frame):
    """Server -> runner: stop this turn now."""

    kind: ClassVar[str] = "cancel"
    turn_id: str



RUNNER_FRAMES: tuple[type[Frame], ...] = (
    Hello, HelloAck, TurnStart, HistoryMiss, TurnEvent, TurnCompleted, TurnFailed, ToolStart, ToolResult, Cancel,
)

__all__ = [
    "RUNNER_FRAMES", "TOOL_STATUSES",
    "Cancel", "Hello", "HelloAck", "HistoryMiss", "ToolResult", "ToolStart", "TurnCompleted", "TurnEvent",
    "TurnFailed", "TurnStart",
]
