"""A websocket route served as bare ASGI in front of quart (front.py): the handshake, the link, the close.

The runner link (`/v1/runners/{id}/ws`, crossed twice a turn) and a session's
watchers (`/v1/sessions/{id}/ws`) are served here. Under quart each message
went through a reader task, a memory channel and two signals between
hypercorn and our code; here `Socket` is hypercorn's ASGI channel itself,
and it is the `Transport` (`runner_link`) that `serve_runner` and
`streams.serve_watcher` speak over, the same as quart's rules for those
paths (kept for the route lists) and the tests' memory transports drive.

What it keeps of quart's routes:
- the checks before the handshake (`prepare`: the guard, the session, the
  arguments): a refusal is the error's JSON as the HTTP answer (403, 404,
  400...), and the connection is not accepted;
- a link that ends without a close of its own is closed with 1000, and a
  crash of the route's code is logged and closed with 1011, never left open.

More careful than quart on one edge: a message sent after the socket was
closed (a send racing one of the route's closes) is dropped, where
hypercorn would raise on it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .asgi import Headers, api_error, json_answer
from .errors import ApiError

log = logging.getLogger("omnigent.server")

T = TypeVar("T")


class SocketGone(Exception):
    """The peer's side of the websocket is gone."""


class Socket:
    """An accepted ASGI websocket as `runner_link.Transport`: receive raises SocketGone once the
    peer has left; send and close do nothing once the socket is closed."""

    def __init__(self, receive: Any, send: Any) -> None:
        self._receive = receive
        self._send = send
        self.closed = False

    async def receive(self) -> str | bytes:
        message = await self._receive()
        if message["type"] == "websocket.receive":
            text = message.get("text")
            return text if text is not None else message.get("bytes") or b""
        self.closed = True
        raise SocketGone  # websocket.disconnect: nothing else comes after the connect

    async def send(self, text: str) -> None:
        if not self.closed:
            await self._send({"type": "websocket.send", "text": text})

    async def close(self, code: int, reason: str) -> None:
        if not self.closed:
            self.closed = True
            await self._send({"type": "websocket.close", "code": code, "reason": reason})


async def serve_socket(scope: dict[str, Any], receive: Any, send: Any, prepare: Callable[[Headers], T],
                       serve: Callable[[Socket, Headers, T], Awaitable[None]]) -> None:
    """One websocket, from the handshake to its close: `prepare` (raising ApiError refuses the
    handshake), then `serve` on the accepted socket."""
    headers = Headers(scope["headers"])
    if (await receive())["type"] != "websocket.connect":  # ASGI's first message; a disconnect: gone
        return
    try:
        prepared = prepare(headers)
    except Exception as exc:
        return await _refuse(scope, send, api_error(exc, "WEBSOCKET", scope["path"]))
    await send({"type": "websocket.accept"})
    socket = Socket(receive, send)
    try:
        await serve(socket, headers, prepared)
    except* SocketGone:
        pass  # the peer went away: nothing more is sent
    except* Exception:
        log.exception("unhandled error on WEBSOCKET %s", scope["path"])
        await socket.close(1011, "internal error")
    await socket.close(1000, "")


async def _refuse(scope: dict[str, Any], send: Any, exc: ApiError) -> None:
    """The handshake answered with the error's JSON (as quart answers a route that returns before
    accepting), or a plain close where the server cannot send an HTTP answer."""
    if "websocket.http.response" not in (scope.get("extensions") or {}):
        return await send({"type": "websocket.close", "code": 1000})
    headers, data = json_answer(exc.body())
    await send({"type": "websocket.http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": data})
