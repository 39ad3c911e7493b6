"""A session's event stream that does not give up: SSE with resume by sequence number.

`GET /v1/sessions/{id}/stream?after=N` replays what the session logged after
N, then the live tail. `SessionStream` remembers the sequence number of the
last event it yielded and, when the connection drops or the server goes away
(a restart, `[DONE]` at shutdown, a 5xx), reconnects with capped exponential
backoff from exactly there. Events at or below that number are dropped, so
across any number of reconnects a caller sees every event once, in order.

The server stores its log, so the numbers go on across its restarts and a
reconnect from the cursor misses nothing. When the server cannot replay
from the cursor (compacted, older than its log, or above its newest number)
it sends one `Resync` snapshot instead; the cursor moves to the snapshot's
number, even when that is lower, and the stream goes on from there.

Heartbeats (`session.heartbeat`, every 15 s from the server) are consumed
here: they prove the connection alive and reset the backoff, and when the
stream was opened live-only (`after=None`) the first one's sequence number
becomes the resume point. Pass `heartbeats=True` to see them too, as typed
`Heartbeat` events (SessionsChat does, to know it is subscribed).

A 4xx other than 408/429 is final (no such session, bad token): it is raised,
not retried. Transport errors are retried for as long as the caller keeps
iterating; bound that with your own timeout (`anyio.fail_after`) if needed,
or pass `reconnect=False` to get the first failure as an `APIConnectionError`.
Reading times out after `read_timeout` seconds of silence (four missed
heartbeats by default), which counts as a dropped connection.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx

from ._errors import APIConnectionError, ProtocolError, ServerError, connection_error, error_for_status
from ._events import Event, Heartbeat, Resync, parse_event
from ._http import Transport, _json_or_none
from ._sse import DONE, iter_sse

log = logging.getLogger("omnigent_client.stream")

BACKOFF_FIRST = 0.1   # seconds before the first reconnect
BACKOFF_CAP = 5.0     # the longest wait between attempts
READ_TIMEOUT = 60.0   # silence that counts as a dead connection (the server beats every 15 s)


class SessionStream:
    """An async iterator of `Event`s; also an async context manager that closes the connection."""

    def __init__(self, transport: Transport, session_id: str, after: int | None, *,
                 heartbeats: bool = False, reconnect: bool = True,
                 read_timeout: float = READ_TIMEOUT) -> None:
        self._transport = transport
        self.session_id = session_id
        self.cursor = after  # the last sequence number yielded (or the resume point)
        self._heartbeats = heartbeats
        self._reconnect = reconnect
        self._read_timeout = read_timeout
        self.reconnects = 0  # how many times the connection was opened again (for tests, figures)
        self._gen: AsyncIterator[Event] | None = None

    def __aiter__(self) -> SessionStream:
        return self

    async def __anext__(self) -> Event:
        if self._gen is None:
            self._gen = self._run()
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        if self._gen is not None:
            await self._gen.aclose()  # type: ignore[attr-defined]

    async def __aenter__(self) -> SessionStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self) -> AsyncIterator[Event]:
        failures = 0
        while True:
            try:
                async for event in self._connection():
                    failures = 0  # the connection works: the next drop starts the backoff over
                    if self._heartbeats or not isinstance(event, Heartbeat):
                        yield event
                reason: str = "the server ended the stream"
            except (APIConnectionError, ServerError, ProtocolError) as exc:
                if not self._reconnect:
                    raise
                reason = str(exc)
            if not self._reconnect:
                return
            delay = min(BACKOFF_CAP, BACKOFF_FIRST * 2 ** failures)
            failures += 1
            log.debug("stream %s: %s; reconnecting after %s in %.1fs",
                      self.session_id, reason, self.cursor, delay)
            await anyio.sleep(delay)
            self.reconnects += 1

    async def _connection(self) -> AsyncIterator[Event]:
        """One connection's events past the cursor; returns when the server ends it."""
        path = f"/v1/sessions/{self.session_id}/stream"
        params: dict[str, Any] = {}
        headers: dict[str, str] = {"Accept": "text/event-stream"}
        if self.cursor is not None:
            params["after"] = self.cursor
            headers["Last-Event-ID"] = str(self.cursor)
        base = self._transport.http.timeout
        timeout = httpx.Timeout(connect=base.connect, write=base.write, pool=base.pool,
                                read=self._read_timeout)
        http = self._transport.http
        try:
            async with http.stream("GET", path, params=params, headers=headers,
                                   timeout=timeout) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    err = error_for_status(resp.status_code, _json_or_none(resp), f"GET {path}")
                    if resp.status_code in (408, 429):
                        raise ServerError(err.message, err.status_code, err.code)
                    raise err
                async for sse in iter_sse(resp.aiter_lines()):
                    if sse.data == DONE:
                        return
                    try:
                        data = json.loads(sse.data)
                    except ValueError:
                        raise ProtocolError(f"stream {self.session_id}: an event is not JSON") from None
                    if not isinstance(data, dict):
                        continue
                    event = parse_event(data, event_type=sse.event, event_id=sse.id)
                    if isinstance(event, Heartbeat):
                        # the greeting carries the server's newest number: live-only resumes from it
                        if self.cursor is None and event.sequence_number is not None:
                            self.cursor = event.sequence_number
                        yield event
                        continue
                    if isinstance(event, Resync):
                        self.cursor = event.sequence_number  # the snapshot's position, even if lower
                        yield event
                        continue
                    seq = event.sequence_number
                    if seq is not None:
                        if self.cursor is not None and seq <= self.cursor:
                            continue  # already yielded before a reconnect
                        self.cursor = seq
                    yield event
        except httpx.TransportError as exc:
            raise connection_error(exc, self._transport.base_url) from None

