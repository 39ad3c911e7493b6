"""quart 0.22 and 0.23 behind one name (stack-notes G3).

pip resolves quart 0.22 / quart-trio 0.12 on Python 3.11-3.12 and quart 0.23 /
quart-trio 0.13 on 3.13, and pyproject.toml allows both. They differ in what a
websocket handler sees when its client goes away: on 0.22 the handler is just
cancelled; on 0.23 `websocket.receive()` and `websocket.send()` raise
`quart.wrappers.base.ClientDisconnectedError`, which quart logs as an ERROR
traceback when it leaves the handler inside an exception group (every handler
here runs a nursery). Handlers catch `CLIENT_DISCONNECTED` with `except*`, so a
client that leaves ends the handler quietly on both versions. On 0.22 it is an
empty tuple, which matches nothing.
"""

from __future__ import annotations

import quart.wrappers.base as _base
from quart import websocket

CLIENT_DISCONNECTED: tuple[type[Exception], ...] = tuple(
    cls for cls in (getattr(_base, "ClientDisconnectedError", None),) if cls is not None
)


class QuartSocket:
    """The current quart websocket as `runner_link.Transport` (what quart's own websocket rules
    serve over; the front serves the same paths over `asgi_socket.Socket`)."""

    async def receive(self) -> str | bytes:
        return await websocket.receive()

    async def send(self, text: str) -> None:
        await websocket.send(text)

    async def close(self, code: int, reason: str) -> None:
        await websocket.close(code, reason)
