"""The hot routes, served in front of quart as bare ASGI: the message post, the runner link, the stream.

Every turn takes three routes: a client posts its message, the server and
the runner exchange the step over the runner's websocket, and the answer
reaches the client on the session's SSE stream. Under quart each paid for
what a general framework does per request and per message: a request object
and its context, a reader task beside the handler, hooks, a response of three
sends, a channel hop and two signals per websocket message. Served here, the
three cost the server ~16 % less CPU a lone turn (README, figures).

- `POST /v1/sessions/{id}/events`: below.
- `/v1/runners/{id}/ws`: `runner_socket.py`.
- `GET /v1/sessions/{id}/stream`: below, over `streams.sse_chunks`.

Every other request goes to quart untouched. quart's rules for these paths
stay (their 405s, the route lists that the fuzz reads) and serve the same
functions (`conversation.events_route`, `runner_link.serve_runner`,
`streams.sse_chunks`).

What the post and the stream keep of what `app.py` guarantees every route
(`asgi.answer` finishes their answers as quart's hooks did):
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
- a client gone before its body arrived gets nothing, and a stream ends
  when its client hangs up, as under quart.

Not kept, on purpose: quart cancelled a post's handler whose client hung up
after sending its body. That work is bounded (a transaction, then the
dispatch's wait of `HOLD_MAX` at most), and a message already stored is the
same whether or not its poster waits for the answer.
"""

from __future__ import annotations

import logging
import re
from contextlib import aclosing
from typing import Any
from urllib.parse import parse_qsl

import trio

from ..config.timeline import stamp
from . import streams
from ._routes import check_origin, conversation
from .asgi import ClientGone, Request, answer
from .conversation import PostEvent
from .errors import ApiError, of_store
from .runner_socket import serve_runner_socket
from .state import ServerState

log = logging.getLogger("omnigent.server")

# quart's `<session_id>` and `<runner_id>`: one path segment, not empty
_EVENTS = re.compile(r"/v1/sessions/([^/]+)/events")
_STREAM = re.compile(r"/v1/sessions/([^/]+)/stream")
_RUNNER_WS = re.compile(r"/v1/runners/([^/]+)/ws")
_SSE_HEADERS = [(name.lower().encode(), value.encode()) for name, value in streams.SSE_HEADERS.items()]


def with_front(asgi_app: Any, state: ServerState, post_event: PostEvent) -> Any:
    """`asgi_app` (quart's) behind the front: the hot routes are answered here, the rest by quart."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind, path = scope["type"], scope["path"]
        if kind == "http" and scope["method"] == "POST" and (match := _EVENTS.fullmatch(path)):
            return await _post_event(state, post_event, match.group(1), scope, Request(scope, receive), send)
        if kind == "http" and scope["method"] == "GET" and (match := _STREAM.fullmatch(path)):
            return await _event_stream(state, match.group(1), scope, Request(scope, receive), send)
        if kind == "websocket" and (match := _RUNNER_WS.fullmatch(path)):
            return await serve_runner_socket(state, match.group(1), scope, receive, send)
        return await asgi_app(scope, receive, send)

    return app


async def _post_event(state: ServerState, post_event: PostEvent, session_id: str,
                      scope: dict[str, Any], request: Request, send: Any) -> None:
    entered = stamp()
    try:
        check_origin(state, request.headers, needs_token=True)
    except ApiError as exc:  # refused before its body is read; nothing of it is read
        return await answer(send, request, exc.body(), exc.status, close=True)
    try:
        body, status = await post_event(session_id, request.read_json, entered)
    except ClientGone:
        return
    except Exception as exc:
        error = _api_error(exc, scope)
        body, status = error.body(), error.status
    await answer(send, request, body, status)


async def _event_stream(state: ServerState, session_id: str, scope: dict[str, Any], request: Request,
                        send: Any) -> None:
    """The SSE stream (streams.sse_chunks): the same refusals as quart's route, then chunks as
    they come, until the stream ends or its client hangs up."""
    try:
        check_origin(state, request.headers, needs_token=True)
    except ApiError as exc:
        return await answer(send, request, exc.body(), exc.status, close=True)
    try:
        conversation(state, session_id)
        after = streams.after_arg(_Args(scope["query_string"]))
        if after is None:
            after = streams.last_event_id(request.headers.get("last-event-id"))
        chunks = streams.sse_chunks(state, session_id, after)
    except Exception as exc:
        error = _api_error(exc, scope)
        return await answer(send, request, error.body(), error.status)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_cancel_when_gone, request, nursery.cancel_scope)
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        async with aclosing(chunks):
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        nursery.cancel_scope.cancel()


async def _cancel_when_gone(request: Request, scope: trio.CancelScope) -> None:
    await request.gone()
    scope.cancel()


def _api_error(exc: Exception, scope: dict[str, Any]) -> ApiError:
    """What a route's exception answers: its own ApiError, a store error's, else 500 (logged)."""
    error = exc if isinstance(exc, ApiError) else of_store(exc)
    if error is None:
        log.exception("unhandled error on %s %s", scope["method"], scope["path"])
        error = ApiError("internal_error", "internal error")
    return error


class _Args:
    """A query string's arguments, the first of a repeated one (as werkzeug's `request.args.get`)."""

    def __init__(self, query_string: bytes) -> None:
        self._first: dict[str, str] = {}
        for name, value in parse_qsl(query_string.decode("latin1"), keep_blank_values=True, encoding="utf-8",
                                     errors="replace"):
            self._first.setdefault(name, value)

    def get(self, name: str) -> str | None:
        return self._first.get(name)
