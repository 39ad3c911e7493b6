"""Bare ASGI pieces that the routes served in front of quart share (`front.py`, `asgi_socket.py`).

A request's headers read by name as werkzeug reads them, its body read
within `bodies`' bounds, and a JSON answer encoded byte for byte as quart
encodes one, so a client cannot tell which of the two answered.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from werkzeug.http import parse_options_header

from . import bodies
from .errors import ApiError, of_store

log = logging.getLogger("omnigent.server")

CLOSES = (408, 413, 415)  # answered before the body was read whole: the connection is not kept


class ClientGone(Exception):
    """The client hung up: there is nobody to answer."""


class Headers:
    """A request's headers by lower-cased name, the first of a repeated one (as werkzeug's `get`)."""

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self._by_name: dict[str, str] = {}
        for name, value in raw:
            self._by_name.setdefault(name.decode("latin1").lower(), value.decode("latin1"))

    def get(self, name: str) -> str | None:
        return self._by_name.get(name.lower())


class Request:
    """A request's headers, and its body as ASGI hands it over, read at most once."""

    def __init__(self, scope: dict[str, Any], receive: Any) -> None:
        self._receive = receive
        self.ended = False  # the body's last chunk has been read
        self.headers = Headers(scope["headers"])
        length = self.headers.get("content-length")
        self.content_length = int(length) if length is not None and length.isdigit() else None

    def __aiter__(self) -> Request:
        return self

    async def __anext__(self) -> bytes:
        """The body's next chunk (an iterator, not a generator: a read given up halfway leaves
        nothing suspended to finalize). Raises ClientGone when the client hung up first."""
        if self.ended:
            raise StopAsyncIteration
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self.ended = True
            raise ClientGone
        self.ended = not message.get("more_body", False)
        return message.get("body", b"")

    async def read_json(self) -> dict[str, Any]:
        """`bodies.json_body`, on this body: the media type, the bounds, the JSON's limits."""
        bodies.check_json_type(parse_options_header(self.headers.get("content-type") or "")[0].lower() or None)
        raw = await bodies.read_chunks(self, self.content_length, bodies.MAX_JSON_BODY)
        return bodies.parse_json(raw or b"{}", "request body")

    async def drain(self) -> ApiError | None:
        """Read what is left of the body and drop it: None when it ended, else why it could not be."""
        try:
            await bodies.read_chunks(self, self.content_length, bodies.MAX_BODY)
        except ApiError as exc:  # too large or too slow
            return exc
        return None

    async def gone(self) -> None:
        """Return once the client has hung up (what is left of the body is dropped meanwhile)."""
        try:
            async for _ in self:
                pass
            while (await self._receive())["type"] != "http.disconnect":
                pass
        except ClientGone:
            pass


def json_answer(answer: dict[str, Any], *, close: bool = False) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """(headers, body) of a JSON answer as quart writes it: sorted keys, compact, ASCII, a newline."""
    data = (json.dumps(answer, sort_keys=True, separators=(",", ":")) + "\n").encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    return headers, data


async def answer(send: Any, request: Request, answer: dict[str, Any], status: int, *, close: bool = False) -> None:
    """One JSON answer to `request`, as quart's hooks would finish it (app.py): 408, 413 and 415
    close the connection, and an answer given before the body was read whole waits until the rest
    is drained (413 and a close when it is too large, a close when too slow), so keep-alive does
    not stall on it. Nothing is sent to a client that hung up meanwhile."""
    close = close or status in CLOSES
    if not request.ended and not close:
        try:
            unread = await request.drain()
        except ClientGone:
            return
        if unread is not None:
            close = True
            if unread.status == 413:
                answer, status = unread.body(), unread.status
    headers, data = json_answer(answer, close=close)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data, "more_body": False})


def api_error(exc: Exception, method: str, path: str) -> ApiError:
    """What a route's exception answers: its own ApiError, a store error's (404, 409), else 500
    `internal_error`, logged (as quart's error handlers in app.py). Call it in the except block."""
    error = exc if isinstance(exc, ApiError) else of_store(exc)
    if error is None:
        log.exception("unhandled error on %s %s", method, path)
        error = ApiError("internal_error", "internal error")
    return error
