"""What every websocket frame shares, on both links: the base class, the version, ping and pong.

The runner<->server frames (`runner_frames.py`), the host<->server frames
(`host_frames.py`) and the codec (`codec.py`) all build on these, so they live
below all three. A frame is a frozen dataclass whose class-level `kind` names
it on the wire; its fields are JSON values only, which is what lets `encode`
stay shallow and `decode` check every field against its annotation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

# 2: tool steps (ToolStart/ToolResult, TurnStart.step/workspace, HostHello.permissions)
PROTOCOL_VERSION = 2


@dataclass(frozen=True)
class Frame:
    kind: ClassVar[str] = ""


# Both links are kept alive with these: a `Ping` is answered with a `Pong` of the same `ts`.


@dataclass(frozen=True)
class Ping(Frame):
    kind: ClassVar[str] = "ping"
    ts: float


@dataclass(frozen=True)
class Pong(Frame):
    kind: ClassVar[str] = "pong"
    ts: float


LINK_FRAMES: tuple[type[Frame], ...] = (Ping, Pong)

__all__ = ["LINK_FRAMES", "PROTOCOL_VERSION", "Frame", "Ping", "Pong"]
