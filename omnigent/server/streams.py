"""A session's event stream, over SSE and over a websocket.

- `GET /v1/sessions/{id}/stream`: SSE. A greeting heartbeat stating the newest
  sequence number, the events after `?after=N` (or `Last-Event-ID`), then the
  live tail, ended by `data: [DONE]`. Served in front of quart (front.py) from
  `sse_chunks`, with `after_arg` and `last_event_id`; quart's rule serves the same.
- `GET /v1/sessions/{id}/ws`: the same stream as JSON text messages; `?after=N` replays.

Both start from the number the greeting states, so nothing published after it
is missed; both send a heartbeat after `HEARTBEAT_EVERY` s of silence. A server
shutting down closes the websocket with 1001 rather than leaving it to time out.
"""

from __future__ import annotations

import json
from contextlib import aclosing
from collections.abc import AsyncGenerator
from typing import Any

import trio
from quart import Response, request, websocket

from protocol import events as ev

from ._routes import check_origin, conversation
from .errors import ApiError, invalid
from .hub import HEARTBEAT_EVERY
from .memory_log import event_json
from .quart_compat import CLIENT_DISCONNECTED, QuartSocket
from .runner_link import Transport
from .state import ServerState


def register(app: Any, state: ServerState) -> None:

    @app.get("/v1/sessions/<session_id>/stream")
    async def sse(session_id: str):
        """Reached only when quart is driven without its front (front.py serves this path as bare
        ASGI): the same checks and the same chunks."""
        conversation(state, session_id)
        after = after_arg(request.args)
        if after is None:
            after = last_event_id(request.headers.get("Last-Event-ID"))
        response = Response(sse_chunks(state, session_id, after), headers=SSE_HEADERS)
        # quart cuts every response off after its RESPONSE_TIMEOUT (60 s) unless the response
        # sets its own: a stream is followed for as long as its client wants it
        response.timeout = None
        return response

    @app.websocket("/v1/sessions/<session_id>/ws")
    async def session_ws(session_id: str):
        """The same stream as JSON text messages; `?after=N` replays. The client sends nothing.

        Reached only when quart is driven without its front (front.py serves this path as bare
        ASGI over the same `serve_watcher`)."""
        try:
            check_origin(state, websocket.headers, needs_token=True)
            conversation(state, session_id)
            after = after_arg(websocket.args)
        except ApiError as exc:
            return exc.body(), exc.status
        await websocket.accept()
        try:
            await serve_watcher(state, session_id, after, QuartSocket())
        except* CLIENT_DISCONNECTED:
            pass  # the watcher left (quart 0.23 raises on receive/send; 0.22 cancels the handler)


async def serve_watcher(state: ServerState, session_id: str, after: int | None, socket: Transport) -> None:
    """A watcher's accepted websocket: the greeting, the events after `after` (None: live only),
    the live tail, each a JSON text message; closed with 1001 when the server shuts down (not a
    1006 after a 3 s hang, G1). What the client sends is read and dropped: reading notices it leave."""
    async with trio.open_nursery() as n:
        n.start_soon(_close_on_shutdown, state, socket, n)
        n.start_soon(_drain_client, socket)
        now = state.hub.last_seq(session_id)
        await socket.send(json.dumps({"type": ev.HEARTBEAT, "session_id": session_id, "sequence_number": now}))
        stream = state.hub.follow(session_id, now if after is None else after, heartbeat=HEARTBEAT_EVERY)
        async with aclosing(stream):
            async for event in stream:
                await socket.send(event_json(event))
        n.cancel_scope.cancel()


async def _close_on_shutdown(state: ServerState, socket: Transport, n: trio.Nursery) -> None:
    await state.shutting_down.wait()
    await socket.close(1001, "server shutting down")
    n.cancel_scope.cancel()


# the SSE answer's headers (its content type first, as quart sent it)
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_chunks(state: ServerState, session_id: str, after: int | None) -> AsyncGenerator[bytes, None]:
    """SSE: a greeting heartbeat, the events after `after` (None: live only), the live tail, `[DONE]`.

    Each logged event has an `id: <seq>` line, so a browser's EventSource resumes by itself;
    heartbeats (every HEARTBEAT_EVERY s of silence) have none. The greeting states the newest
    number, taken now (not when the first chunk is asked for): a live-only stream starts
    there, so nothing posted after the request is missed."""
    now = state.hub.last_seq(session_id)

    async def chunks() -> AsyncGenerator[bytes, None]:
        yield _sse({"type": ev.HEARTBEAT, "session_id": session_id, "sequence_number": now})
        stream = state.hub.follow_batches(session_id, now if after is None else after, heartbeat=HEARTBEAT_EVERY)
        async with aclosing(stream):
            async for batch in stream:
                yield b"".join(_sse(event) for event in batch)  # one write per burst
        yield b"data: [DONE]\n\n"

    return chunks()


async def _drain_client(socket: Transport) -> None:
    while True:  # clients send nothing we need; reading notices a close
        await socket.receive()


def after_arg(args: Any) -> int | None:
    """`?after=N` of a stream: None when absent, 400 when not an integer."""
    raw = args.get("after")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise invalid("after must be an integer sequence number") from None


def _sse(event: dict[str, Any]) -> bytes:
    seq = event.get("sequence_number") if event["type"] != ev.HEARTBEAT else None
    head = f"id: {seq}\n" if isinstance(seq, int) else ""
    return f"{head}event: {event['type']}\ndata: {event_json(event)}\n\n".encode()


def last_event_id(raw: str | None) -> int | None:
    """The SSE reconnect header: a sequence number we sent, or nothing usable (then: live)."""
    if raw is None:
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise ApiError("invalid_input", "Last-Event-ID must be an integer sequence number") from None
