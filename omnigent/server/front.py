"""The hot routes, served in front of quart as bare ASGI: the message post, the runner link, the streams.

Every turn takes three routes: a client posts its message, the server and
the runner exchange the step over the runner's websocket, and the answer
reaches the client on the session's SSE stream. Under quart each paid for
what a general framework does per request and per message: a request object
and its context, a reader task beside the handler, hooks, a response of three
sends, a channel hop and two signals per websocket message. Served here, the
three cost the server ~16 % less CPU a lone turn (README, figures). A
session's websocket stream is served here too, so that every stream a
watcher follows is served one way.

- `POST /v1/sessions/{id}/events`: below.
- `/v1/runners/{id}/ws` and `/v1/sessions/{id}/ws`: the runner link and a
  session's websocket watchers, over `asgi_socket.py`.
- `GET /v1/sessions/{id}/stream`: below, over `streams.sse_chunks`.

Every other request goes to quart untouched. quart's rules for these paths
stay (their 405s, the route lists that the fuzz reads) and serve the same
functions (`conversation.events_route`, `runner_link.serve_runner`,
`streams.sse_chunks`, `streams.serve_watcher`).

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

import re
from contextlib import aclosing
from typing import Any
from urllib.parse import parse_qsl

import trio

from ..config.timeline import stamp
from ..link.runner_secrets import bearer
from . import streams
from ._routes import check_origin, conversation
from .asgi import ClientGone, Headers, Request, answer, api_error
from .asgi_socket import Socket, serve_socket
from .conversation import PostEvent
from .errors import ApiError
from .runner_link import serve_runner
from .state import ServerState

# quart's `<session_id>` and `<runner_id>`: one path segment, not empty
_EVENTS = re.compile(r"/v1/sessions/([^/]+)/events")
_STREAM = re.compile(r"/v1/sessions/([^/]+)/stream")
_RUNNER_WS = re.compile(r"/v1/runners/([^/]+)/ws")
_WATCHER_WS = re.compile(r"/v1/sessions/([^/]+)/ws")
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
            return await _runner_socket(state, match.group(1), scope, receive, send)
        if kind == "websocket" and (match := _WATCHER_WS.fullmatch(path)):
            return await _watcher_socket(state, match.group(1), scope, receive, send)
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
        error = api_error(exc, scope["method"], scope["path"])
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
        error = api_error(exc, scope["method"], scope["path"])
        return await answer(send, request, error.body(), error.status)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_cancel_when_gone, request, nursery.cancel_scope)
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        async with aclosing(chunks):
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        nursery.cancel_scope.cancel()


async def _runner_socket(state: ServerState, runner_id: str, scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The runner link (`runner_link.serve_runner`): only the secret bound to the id opens it, never
    the client token; the guard still refuses a browser or a rebinding Host before the handshake."""

    def prepare(headers: Headers) -> None:
        check_origin(state, headers, needs_token=False)

    async def serve(socket: Socket, headers: Headers, _: None) -> None:
        await serve_runner(state, runner_id, socket, bearer(headers.get("authorization")))

    await serve_socket(scope, receive, send, prepare, serve)


async def _watcher_socket(state: ServerState, session_id: str, scope: dict[str, Any], receive: Any,
                          send: Any) -> None:
    """A session's events as websocket messages (`streams.serve_watcher`), after the checks of
    quart's route: the guard, the session, `?after=N`."""

    def prepare(headers: Headers) -> int | None:
        check_origin(state, headers, needs_token=True)
        conversation(state, session_id)
        return streams.after_arg(_Args(scope["query_string"]))

    async def serve(socket: Socket, headers: Headers, after: int | None) -> None:
        await streams.serve_watcher(state, session_id, after, socket)

    await serve_socket(scope, receive, send, prepare, serve)


async def _cancel_when_gone(request: Request, scope: trio.CancelScope) -> None:
    await request.gone()
    scope.cancel()


class _Args:
    """A query string's arguments, the first of a repeated one (as werkzeug's `request.args.get`)."""

    def __init__(self, query_string: bytes) -> None:
        self._first: dict[str, str] = {}
        for name, value in parse_qsl(query_string.decode("latin1"), keep_blank_values=True, encoding="utf-8",
                                     errors="replace"):
            self._first.setdefault(name, value)

    def get(self, name: str) -> str | None:
        return self._first.get(name)
