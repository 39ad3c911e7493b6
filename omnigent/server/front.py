"""The hot routes, served in front of quart as bare ASGI: the message post and the runner websocket.

- `POST /v1/sessions/{id}/events`: every turn a client starts is one such
  post. Under quart it paid for a request object and its context, two tasks
  (the body's reader and the handler), the hooks and a response of three
  sends: ~1.4 ms of the server's CPU a lone turn, ~14 % (three A/B pairs of
  `scripts/bench_sessions.py`; `bench_framework.py`'s bare exchange alone
  shows 0.5 ms). Answered here, below.
- `/v1/runners/{id}/ws`: the runner link, which every turn crosses twice
  (`runner_socket.py`).

Every other request goes to quart untouched. quart's rules for these paths
stay (their 405s, the route lists that the fuzz reads) and serve the same
functions (`conversation.events_route`, `runner_link.serve_runner`).

What the post keeps of what `app.py` guarantees every route:
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

import logging
import re
from typing import Any

from werkzeug.http import parse_options_header

from ..config.timeline import stamp
from . import bodies
from ._routes import check_origin
from .asgi import Headers, json_answer
from .conversation import PostEvent
from .errors import ApiError, of_store
from .runner_socket import serve_runner_socket
from .state import ServerState

log = logging.getLogger("omnigent.server")

_EVENTS = re.compile(r"/v1/sessions/([^/]+)/events")  # quart's `<session_id>`: one segment, not empty
_RUNNER_WS = re.compile(r"/v1/runners/([^/]+)/ws")
_CLOSES = (408, 413, 415)  # answered before the body was read whole: the connection is not kept


def with_front(asgi_app: Any, state: ServerState, post_event: PostEvent) -> Any:
    """`asgi_app` (quart's) behind the front: a POST to a session's events and a runner's websocket
    are answered here."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = _EVENTS.fullmatch(scope["path"])
            if match is not None:
                return await _post_event(state, post_event, match.group(1), scope, _Body(scope, receive), send)
        elif scope["type"] == "websocket":
            match = _RUNNER_WS.fullmatch(scope["path"])
            if match is not None:
                return await serve_runner_socket(state, match.group(1), scope, receive, send)
        return await asgi_app(scope, receive, send)

    return app


class _ClientGone(Exception):
    """The client hung up before its body was in: there is nobody to answer."""


class _Body:
    """A request's body as ASGI hands it over, read at most once, with what its headers say of it."""

    def __init__(self, scope: dict[str, Any], receive: Any) -> None:
        self._receive = receive
        self.ended = False
        self.headers = Headers(scope["headers"])
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
    headers, data = json_answer(answer, close=close)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data, "more_body": False})
