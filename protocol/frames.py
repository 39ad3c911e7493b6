"""Websocket frames: runner<->server and host<->server.

Every frame is one JSON object with a `kind`. Decoding is strict: an unknown
kind, a missing, extra or mistyped field, an oversized frame or another
protocol version raises `ProtocolError`, so bad peers fail loudly at the edge
instead of deep inside the server.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

from .errors import ProtocolError
from .jsonobj import load_object

# 2: tool steps (ToolStart/ToolResult, TurnStart.step/workspace, HostHello.permissions)
PROTOCOL_VERSION = 2
MAX_FRAME_BYTES = 16 * 1024 * 1024
# values in one frame (a turn's whole output, a long history): bounds the time a parse can take
MAX_FRAME_VALUES = 1_000_000


@dataclass(frozen=True)
class Frame:
    kind: ClassVar[str] = ""


# --- runner <-> server -------------------------------------------------------


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


@dataclass(frozen=True)
class HelloAck(Frame):
    """Server -> runner: accepted; ping every `ping_interval` seconds."""

    kind: ClassVar[str] = "hello.ack"
    ping_interval: float


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
    kind: ClassVar[str] = "turn.completed"
    turn_id: str
    response_id: str
    output: list[dict[str, Any]]
    usage: dict[str, Any] | None = None


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


@dataclass(frozen=True)
class Ping(Frame):
    kind: ClassVar[str] = "ping"
    ts: float


@dataclass(frozen=True)
class Pong(Frame):
    kind: ClassVar[str] = "pong"
    ts: float


# --- host <-> server ---------------------------------------------------------


@dataclass(frozen=True)
class HostHello(Frame):
    """Host -> server, the first frame on a host link (`/v1/hosts/{host_id}/ws`, bearer = host secret).

    `workspace_roots` are the directories this host's user allowed runners to
    start in (placement of sessions with a workspace considers them);
    `runners` are the ids of runner processes still alive on this host, so a
    host that reconnects (server restart, network blip) re-announces them;
    `capacity` is how many runners it will run at once (0: no stated bound).
    """

    kind: ClassVar[str] = "host.hello"
    host_id: str
    pid: int
    protocol_version: int
    name: str = ""
    workspace_roots: list[str] = dataclasses.field(default_factory=list)
    runners: list[str] = dataclasses.field(default_factory=list)
    capacity: int = 0
    # the most this host lets its runners' tools do (`omnigent host --permissions`):
    # the effective mode of a session placed here is never above it
    permissions: str = "ask"


@dataclass(frozen=True)
class HostHelloAck(Frame):
    """Server -> host: the link is accepted; `generation` is this link's ownership generation.

    The server bumps a host's generation every time it accepts a link for it,
    so frames about runners from an older link of the same host are known late.
    """

    kind: ClassVar[str] = "host.hello_ack"
    ping_interval: float
    generation: int


@dataclass(frozen=True)
class RunnerCredential(Frame):
    """Host -> server, before the launch: the sha256 (hex) of the secret bound to `runner_id`.

    The host mints the secret and gives it only to the runner's environment;
    the server learns just its hash. The runner may dial before the server has
    read this frame: the server waits a bounded time for the credential.
    """

    kind: ClassVar[str] = "host.runner_credential"
    runner_id: str
    secret_hash: str


@dataclass(frozen=True)
class RunnerLaunched(Frame):
    """Host -> server: a runner process exists (before it said hello)."""

    kind: ClassVar[str] = "host.runner_launched"
    runner_id: str
    pid: int
    log_path: str = ""


@dataclass(frozen=True)
class RunnerExited(Frame):
    """Host -> server: a runner process ended; `reason` is one human line."""

    kind: ClassVar[str] = "host.runner_exited"
    runner_id: str
    code: int | None
    signal: int | None
    reason: str
    log_tail: str = ""
    gave_up: bool = False


@dataclass(frozen=True)
class RunnerOnline(Frame):
    """Server -> host: that runner said hello; the supervisor may call it started."""

    kind: ClassVar[str] = "host.runner_online"
    runner_id: str


@dataclass(frozen=True)
class LaunchRunner(Frame):
    """Server -> host: start one runner (for `session_id`, in `workspace`, when given).

    The host answers with a `LaunchResult` carrying the same `request_id`. It
    decides itself whether `workspace` is allowed (`workspace_not_allowed`
    otherwise); the session id lets it give that runner the model endpoint
    and key that the session's own client handed it locally.
    """

    kind: ClassVar[str] = "host.launch_runner"
    request_id: str
    session_id: str | None = None
    workspace: str | None = None


@dataclass(frozen=True)
class LaunchResult(Frame):
    """Host -> server: the answer to a `LaunchRunner`; `runner_id` or an error code.

    Sent only after the runner's `RunnerCredential` and `RunnerLaunched`
    frames (same link, same order), and after the launch line is in the host's
    log. Error codes: `workspace_not_allowed`, `at_capacity`, `launch_failed`.
    """

    kind: ClassVar[str] = "host.launch_result"
    request_id: str
    runner_id: str | None = None
    error_code: str | None = None
    message: str = ""


@dataclass(frozen=True)
class KillRunner(Frame):
    """Server -> host: kill that runner's process group (e.g. it stopped answering pings)."""

    kind: ClassVar[str] = "host.kill_runner"
    runner_id: str
    reason: str


FRAME_TYPES: dict[str, type[Frame]] = {
    cls.kind: cls
    for cls in (
        Hello, HelloAck, TurnStart, HistoryMiss, TurnEvent, TurnCompleted, TurnFailed, ToolStart, ToolResult, Cancel,
        Ping, Pong,
        HostHello, HostHelloAck, RunnerCredential, RunnerLaunched, RunnerExited, RunnerOnline, LaunchRunner,
        LaunchResult, KillRunner,
    )
}


def encode(frame: Frame) -> str:
    """One frame as compact JSON.

    Shallow on purpose: frames hold only JSON values, so `dataclasses.asdict`'s
    deep copy bought nothing and cost 30 ms for a 2,000-item turn start, on the
    server's event loop, on every turn. json.dumps walks the values anyway.
    """
    data = {"kind": frame.kind}
    for name in _field_names(type(frame)):
        value = getattr(frame, name)
        if name in _OMITTED_WHEN_EMPTY and not value:
            continue  # a peer of before these fields reads the frame as it always did
        data[name] = value
    return json.dumps(data, separators=(",", ":"))


# Optional fields added without a version bump: left out at their default, so a runner or
# server that predates them (strict decoding refuses unknown fields) still reads the frame.
_OMITTED_WHEN_EMPTY = frozenset({"features", "history_from", "history_hash"})


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def decode(raw: str | bytes) -> Frame:
    if len(raw) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(raw)} bytes exceeds {MAX_FRAME_BYTES}", ProtocolError.TOO_LARGE)
    data = load_object(raw, "frame", max_values=MAX_FRAME_VALUES)
    kind = data.pop("kind", None)
    cls = FRAME_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown frame kind {kind!r}")
    frame = _build(cls, data)
    version = getattr(frame, "protocol_version", PROTOCOL_VERSION)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version {version} is not supported (this side speaks {PROTOCOL_VERSION})",
            ProtocolError.VERSION,
        )
    return frame


def _build(cls: type[Frame], data: dict[str, Any]) -> Frame:
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    extra = set(data) - set(fields)
    if extra:
        raise ProtocolError(f"{cls.kind}: unexpected field {sorted(extra)[0]!r}")
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ProtocolError(f"{cls.kind}: missing field {name!r}")
            continue
        if not _matches(data[name], hints[name]):
            raise ProtocolError(f"{cls.kind}: field {name!r} must be {_describe(hints[name])}")
    return cls(**data)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _matches(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is Any:
        return True
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(_matches(v, item) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(isinstance(k, str) for k in value)
    return isinstance(value, hint)


def _describe(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


__all__ = ["FRAME_TYPES", "MAX_FRAME_BYTES", "PROTOCOL_VERSION", "TOOL_STATUSES", "Frame", "decode", "encode"]
