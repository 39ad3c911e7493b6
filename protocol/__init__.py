"""The wire language between omnigent processes: websocket frames and session events.

Pure data and strict decoding, no I/O, so the server, the host and the runner
agree on one definition and a malformed peer is rejected in one place.
"""

from .errors import ProtocolError
from .events import EVENT_TYPES, TERMINAL_EVENTS, decode_event, make_event
from .codec import MAX_FRAME_BYTES, decode, encode
from .frame import PROTOCOL_VERSION, Frame, Ping, Pong
from .host_frames import (
    HostHello,
    HostHelloAck,
    KillRunner,
    LaunchResult,
    LaunchRunner,
    RunnerCredential,
    RunnerExited,
    RunnerLaunched,
    RunnerOnline,
)
from .runner_frames import (
    ACKNOWLEDGED_FEATURES,
    ITEMS_IN_COMPLETED,
    TOOL_STATUSES,
    Cancel,
    Hello,
    HelloAck,
    HistoryMiss,
    ToolResult,
    ToolStart,
    TurnCompleted,
    TurnEvent,
    TurnFailed,
    TurnStart,
)

__all__ = [
    "ACKNOWLEDGED_FEATURES", "EVENT_TYPES", "ITEMS_IN_COMPLETED", "MAX_FRAME_BYTES", "PROTOCOL_VERSION", "TERMINAL_EVENTS",
    "Cancel", "Frame", "Hello", "HelloAck", "HistoryMiss", "HostHello", "HostHelloAck", "KillRunner", "LaunchResult",
    "LaunchRunner",
    "Ping", "Pong", "ProtocolError", "RunnerCredential", "RunnerExited", "RunnerLaunched", "RunnerOnline",
    "TOOL_STATUSES", "ToolResult", "ToolStart", "TurnCompleted", "TurnEvent", "TurnFailed", "TurnStart",
    "decode", "decode_event", "encode", "make_event",
]
