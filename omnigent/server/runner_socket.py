"""The runner websocket (`/v1/runners/{id}/ws`) as bare ASGI, in front of quart (front.py).

Every turn crosses it twice (the TurnStart out, the TurnCompleted back), and
quart put a task, a memory channel and two signals between hypercorn and
`runner_link` for each message. Here the link's `Transport` is hypercorn's
ASGI channel itself; `runner_link.serve_runner` is the same code that quart's
rule for the path (`runners.py`, kept for the route lists) and the tests'
memory transports drive.

What it keeps of quart's route:
- the guard before the handshake: a browser origin or a rebinding Host is
  refused with its JSON error as the HTTP answer (403), not accepted;
- the secret is the runner's (`serve_runner`: 4003 without it); the client
  token opens nothing here;
- a link that ends without a close of its own is closed with 1000, and a
  crash of the link's code is logged and closed with 1011, never left open.

More careful than quart on one edge: a frame sent after the link was closed
(a send racing a close of `serve_runner`'s) is dropped, where hypercorn would
raise on it.
"""

from __future__ import annotations

import logging
from typing import Any

from ..link.runner_secrets import bearer
from ._routes import check_origin
from .asgi import Headers, json_answer
from .errors import ApiError
from .runner_link import serve_runner
from .state import ServerState

log = logging.getLogger("omnigent.server")


class _Disconnected(Exception):
    """The runner's side of the websocket is gone."""


class _AsgiTransport:
    """An accepted ASGI websocket as `runner_link.Transport`."""

    def __init__(self, receive: Any, send: Any) -> None:
        self._receive = receive
        self._send = send
        self.closed = False

    async def receive(self) -> str | bytes:
        message = await self._receive()
        if message["type"] == "websocket.receive":
            text = message.get("text")
            return text if text is not None else message.get("bytes") or b""
        raise _Disconnected  # websocket.disconnect: nothing else comes after the connect

    async def send(self, text: str) -> None:
        if not self.closed:
            await self._send({"type": "websocket.send", "text": text})

    async def close(self, code: int, reason: str) -> None:
        if not self.closed:
            self.closed = True
            await self._send({"type": "websocket.close", "code": code, "reason": reason})


async def serve_runner_socket(state: ServerState, runner_id: str, scope: dict[str, Any],
                              receive: Any, send: Any) -> None:
    """One runner's websocket, from the handshake to its close."""
    headers = Headers(scope["headers"])
    if (await receive())["type"] != "websocket.connect":  # ASGI's first message; a disconnect: gone
        return
    try:
        check_origin(state, headers, needs_token=False)
    except ApiError as exc:
        return await _refuse(scope, send, exc)
    await send({"type": "websocket.accept"})
    transport = _AsgiTransport(receive, send)
    try:
        await serve_runner(state, runner_id, transport, bearer(headers.get("authorization")))
    except* _Disconnected:
        transport.closed = True  # the runner went away: nothing more is sent
    except* Exception:
        log.exception("unhandled error on WEBSOCKET %s", scope["path"])
        await transport.close(1011, "internal error")
    await transport.close(1000, "")


async def _refuse(scope: dict[str, Any], send: Any, exc: ApiError) -> None:
    """The handshake answered with the error's JSON (as quart answers a route that returns before
    accepting), or a plain close where the server cannot send an HTTP answer."""
    if "websocket.http.response" not in (scope.get("extensions") or {}):
        return await send({"type": "websocket.close", "code": 1000})
    headers, data = json_answer(exc.body())
    await send({"type": "websocket.http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": data})
