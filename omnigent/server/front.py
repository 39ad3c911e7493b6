"""The hot route served in front of quart, as bare ASGI: `POST /v1/sessions/{id}/events`.

Every turn a client starts is one such post. Under quart it paid for a
request object and its context, two tasks (the body's reader and the
handler), the hooks and a response of three sends: about 0.5 ms of the
server's CPU a post, ~5 % of a lone turn's (`scripts/bench_framework.py`:
quart's POST against the same exchange as bare ASGI). The front answers
that one method on that one path itself and hands every other request to
quart untouched; quart's rule for the path stays (its 405 for the other
methods, the route lists) and serves the same function
(`conversation.events_route`).

What it keeps of what `app.py` guarantees every route:
- the guard first: a browser origin, a rebinding Host or a missing client
  token is refused before any of the body is read, and the connection is
  closed after the answer;
- the body bounded (`bodies`): 415 unless it is application/json, 413 past
  `MAX_JSON_BODY` (by its Content-Length before reading, else as it
  arrives), 408 when it is not in within `BODY_TIMEOUT`; 408, 413 and 415
  close the connection;
- an answer given before the body was read (an unknown session's 404) waits
  until the rest is drained, or closes the connection when it is too large
  or too slow, so keep-alive does not stall (quart's `_drain_body`);
- one JSON error shape, the store's errors as 404 and 409, and anything
  else logged and answered 500 `internal_error`, never a bare page;
- a client gone before its body arrived gets nothing, as under quart.

Not kept, on purpose: quart cancelled a handler whose client hung up after
sending its body. This route's work is bounded (a transaction, then the
dispatch's wait of `HOLD_MAX` at most), and a message already stored is the
same whether or not its poster waits for the answer.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from werkzeug.http import parse_options_header

from ..config.timeline import stamp
from . import bodies
from ._routes import check_origin
from .conversation import PostEvent
from .errors import ApiError, of_store
from .state import ServerState

log = logging.getLogger("omnigent.server")

_EVENTS = re.compile(r"/v1/sessions/([^/]+)/events")  # quart's `<session_id>`: one segment, not empty
_CLOSES = (408, 413, 415)  # answered before the body was read whole: the connection is not kept


def with_front(asgi_app: Any, state: ServerState, post_event: PostEvent) -> Any:
    """`asgi_app` (quart's) behind the front: a POST to a session's events is answered here."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = _EVENTS.fullmatch(scope["path"])
            if match is not None:
                return await _post_event(state, post_event, match.group(1), scope, _Body(scope, receive), send)
        return await asgi_app(scope, receive, send)

    return app


class _ClientGone(Exception):
    """The client hung up before its body was in: there is nobody to answer."""


class _Body:
    """A request's body as ASGI hands it over, read at most once, with what its headers say of it."""

    def __init__(self, scope: dict[str, Any], receive: Any) -> None:
        self._receive = receive
        self.ended = False
        self.headers = _Headers(scope["headers"])
        length = self.headers.get("content-length")
        self.content_length = int(length) if length is not None and length.isdigit() else None

    def __aiter__(self) -> _Body:
        return self

    async def __anext__(self) -> bytes:
        """The body's next chunk (an iterator, not a generator: a read given up halfway leaves
        nothing suspended to finalize)."""
        if self.ended:
            raise StopAsyncIteration
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self.ended = True
            raise _ClientGone
        self.ended = not message.get("more_body", False)
        return message.get("body", b"")

    async def read_json(self) -> dict[str, Any]:
        """`bodies.json_body`, on this body: the media type, the bounds, the JSON's limits."""
        bodies.check_json_type(parse_options_header(self.headers.get("content-type") or "")[0].lower() or None)
        raw = await bodies.read_chunks(self, self.content_length, bodies.MAX_JSON_BODY)
        return bodies.parse_json(raw or b"{}", "request body")

    async def drain(self) -> ApiError | None:
        """Read what is left and drop it: None when it ended, else why it could not be read."""
        try:
            await bodies.read_chunks(self, self.content_length, bodies.MAX_BODY)
        except ApiError as exc:  # too large or too slow: answered, then the connection closed
            return exc
        return None


class _Headers:
    """A request's headers by lower-cased name, the first of a repeated one (as werkzeug's `get`)."""

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self._by_name: dict[str, str] = {}
        for name, value in raw:
            self._by_name.setdefault(name.decode("latin1").lower(), value.decode("latin1"))

    def get(self, name: str) -> str | None:
        return self._by_name.get(name.lower())


async def _post_event(state: ServerState, post_event: PostEvent, session_id: str,
                      scope: dict[str, Any], body: _Body, send: Any) -> None:
    entered = stamp()
    try:
        check_origin(state, body.headers, needs_token=True)
    except ApiError as exc:  # refused before its body is read; nothing of it is read
        return await _answer(send, exc.body(), exc.status, close=True)
    try:
        answer, status = await post_event(session_id, body.read_json, entered)
    except _ClientGone:
        return
    except Exception as exc:
        error = exc if isinstance(exc, ApiError) else of_store(exc)
        if error is None:
            log.exception("unhandled error on POST %s", scope["path"])
            error = ApiError("internal_error", "internal error")
        answer, status = error.body(), error.status
    close = status in _CLOSES
    if not body.ended and not close:  # answered before the body was read: drain it first
        try:
            unread = await body.drain()
        except _ClientGone:
            return
        if unread is not None:
            close = True
            if unread.status == 413:
                answer, status = unread.body(), unread.status
    await _answer(send, answer, status, close=close)


async def _answer(send: Any, answer: dict[str, Any], status: int, *, close: bool) -> None:
    """One JSON answer, encoded as quart encodes it (sorted keys, compact, ASCII, a newline)."""
    data = (json.dumps(answer, sort_keys=True, separators=(",", ":")) + "\n").encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data, "more_body": False})
