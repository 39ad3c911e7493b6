"""The host<->server link as a pair of trio memory channels of protocol frames.

In one process (`omnigent run`) the host and the server talk through this;
across processes the same frames travel over a websocket. Either side only
sees `send`/`receive` of frames, so the host code does not care which.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import trio

from protocol import Frame


@dataclass
class LinkEnd:
    send: trio.MemorySendChannel[Frame]
    receive: trio.MemoryReceiveChannel[Frame]

    def post(self, frame: Frame) -> None:
        """Send without waiting: links are unbounded, and callers are sync hooks."""
        try:
            self.send.send_nowait(frame)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # the other side is gone; nothing left to tell


def memory_link() -> tuple[LinkEnd, LinkEnd]:
    """Returns (server end, host end)."""
    to_host_send, to_host_recv = trio.open_memory_channel[Frame](math.inf)
    to_server_send, to_server_recv = trio.open_memory_channel[Frame](math.inf)
    return LinkEnd(to_host_send, to_server_recv), LinkEnd(to_server_send, to_host_recv)
