"""Every websocket frame and the codec under one name, as `protocol.frames` offered them before.

The frames once lived in this one module; they now live by link
(`runner_frames.py`, `host_frames.py`, what both share in `frame.py`) and the
codec in `codec.py`. This module only re-exports them, so an import of the
old path keeps working; new code imports from `protocol` or the module itself.
"""

from .codec import FRAME_TYPES, MAX_FRAME_BYTES, MAX_FRAME_VALUES, decode, encode
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
    "FRAME_TYPES", "MAX_FRAME_BYTES", "MAX_FRAME_VALUES", "PROTOCOL_VERSION", "TOOL_STATUSES",
    "Cancel", "Frame", "Hello", "HelloAck", "HistoryMiss", "HostHello", "HostHelloAck", "KillRunner", "LaunchResult",
    "LaunchRunner", "Ping", "Pong", "RunnerCredential", "RunnerExited", "RunnerLaunched", "RunnerOnline",
    "ToolResult", "ToolStart", "TurnCompleted", "TurnEvent", "TurnFailed", "TurnStart",
    "decode", "encode",
]
