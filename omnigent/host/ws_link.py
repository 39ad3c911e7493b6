"""The host's end of the host link over a websocket: `run_host_link`.

A `Host` pool only sees a `LinkEnd` (`omnigent/link/memory.py`); this
module carries the frames of the other end of that memory link to the
server's `/v1/hosts/{host_id}/ws` and back, so the pool's code is the same
in-process and across machines. What it guarantees:

- Every connect sends a fresh `hello()` (so its `runners` are current) and
  waits for the `HostHelloAck`; `task_status.started(ack)` comes once, on the
  first ack.
- Frames the host posts while the server is away are kept, in order, up to
  `MAX_PENDING` (the oldest are dropped past that, with a warning), and sent
  after the next connect. A frame leaves the queue only once it was sent,
  so a drop mid-send repeats it rather than loses it (the server ignores a
  repeated credential).
- It reconnects forever, with capped exponential backoff and jitter (0.1 s
  doubling to `backoff_cap`, reset by every accepted link), all on trio's
  clock. A server silent for `SILENCE_PINGS` ping intervals counts as gone.
- 4003 (wrong, missing or revoked secret) raises `HostRevoked`: retrying
  cannot help, the daemon exits with one line.
- It answers the server's `Ping` with `Pong` itself, so a busy pool never
  looks hung.

trio-websocket's defaults (1 MiB messages, 60 s timeouts; stack-notes G2)
are set explicitly: messages up to `protocol.MAX_FRAME_BYTES`.
"""

from __future__ import annotations

import collections
import logging
import random
from collections.abc import Awaitable, Callable
from urllib.parse import quote, urlsplit, urlunsplit

import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, HandshakeError, WebSocketConnection, open_websocket_url

import protocol as p

from ..link.memory import LinkEnd

log = logging.getLogger("omnigent.host.link")

REVOKED = 4003
MAX_PENDING = 10_000
CONNECT_TIMEOUT = 10.0
DISCONNECT_TIMEOUT = 2.0
HELLO_TIMEOUT = 10.0
SILENCE_PINGS = 10          # ping intervals without a frame from the server: it is gone
FIRST_DELAY = 0.1


class HostRevoked(Exception):
    """4003: the host's credential is revoked or wrong; reconnecting cannot help."""


def host_ws_url(server_url: str, host_id: str) -> str:
    parts = urlsplit(server_url.rstrip("/"))
    scheme = {"https": "wss", "http": "ws"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, f"{parts.path}/v1/hosts/{quote(host_id, safe='')}/ws", "", ""))


async def run_host_link(server_url: str, host_id: str, host_secret: str, link: LinkEnd,
                        hello: Callable[[], p.HostHello], *,
                        backoff_cap: float = 5.0,
                        task_status: trio.TaskStatus[p.HostHelloAck] = trio.TASK_STATUS_IGNORED) -> None:
    """Carry frames between `link` (the Host's end, see omnigent/link/memory.py) and the server.

    Connects, sends hello() (called anew on every connect, so `runners` is current), waits for
    the ack, calls task_status.started(ack) the first time, then bridges both ways. Frames the
    host posts while the server is away are kept (bounded) and sent after the next connect.
    Reconnects forever with capped exponential backoff + jitter (0.1 s doubling to backoff_cap);
    raises HostRevoked on 4003. Answers Ping with Pong itself. Returns when the host closes
    its end of `link`.
    """
    bridge = _Bridge(host_ws_url(server_url, host_id), host_secret, link, hello)
    revoked: str | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(bridge.collect, nursery.cancel_scope)
        delay = FIRST_DELAY
        started = False

        def on_ack(ack: p.HostHelloAck) -> None:
            nonlocal delay, started
            delay = FIRST_DELAY
            if not started:
                started = True
                task_status.started(ack)

        while True:
            await bridge.session(on_ack)
            if bridge.closed_with == REVOKED:
                revoked = f"the server refused host {host_id}: {bridge.close_reason or 'revoked'}"
                nursery.cancel_scope.cancel()
                break
            wait = min(delay, backoff_cap) * random.uniform(0.5, 1.0)
            log.info("host link: reconnecting in %.2f s (%s)", wait, bridge.last_error or "closed")
            await trio.sleep(wait)
            delay = min(delay * 2, backoff_cap)
    if revoked is not None:  # raised outside the nursery: the daemon catches it unwrapped
        raise HostRevoked(revoked)


class _Bridge:
    """One host link's state across its reconnects: the queue, the current connection."""

    def __init__(self, url: str, secret: str, link: LinkEnd, hello: Callable[[], p.HostHello]) -> None:
        self.url = url
        self.headers = [(b"authorization", f"Bearer {secret}".encode())]
        self.link = link
        self.hello = hello
        self.pending: collections.deque[p.Frame] = collections.deque()
        self._more = trio.Event()
        self.ws: WebSocketConnection | None = None
        self.closed_with: int | None = None
        self.close_reason = ""
        self.last_error = ""
        self.ping_interval = 1.0
        self._send_lock = trio.Lock()

    async def collect(self, done: trio.CancelScope) -> None:
        """Queue every frame the host posts; when the host closes its end, the link ends."""
        async for frame in self.link.receive:
            if len(self.pending) >= MAX_PENDING:
                dropped = self.pending.popleft()
                log.warning("host link: %d frames waiting for the server; dropped a %s",
                            MAX_PENDING, dropped.kind)
            self.pending.append(frame)
            self._more.set()
        done.cancel()

    async def session(self, on_ack: Callable[[p.HostHelloAck], None]) -> None:
        """One connection: open, hello, ack, then bridge both ways until it ends.

        Why it ended is left in `closed_with` / `close_reason` / `last_error`.
        """
        self.closed_with, self.close_reason = None, ""
        try:
            async with open_websocket_url(
                    self.url, extra_headers=self.headers, max_message_size=p.MAX_FRAME_BYTES,
                    connect_timeout=CONNECT_TIMEOUT, disconnect_timeout=DISCONNECT_TIMEOUT) as ws:
                self.ws = ws
                try:
                    ack = await self._handshake()
                    if ack is None:
                        return
                    on_ack(ack)
                    async with trio.open_nursery() as n:
                        n.start_soon(self._until_closed, self._send_pending, n)
                        await self._until_closed(self._receive, n)
                except ConnectionClosed as exc:
                    self._closed(exc)
        except (HandshakeError, OSError) as exc:
            if self.closed_with is None:
                self.last_error = _why(exc)
            if isinstance(exc, ConnectionRejected) and exc.status_code in (401, 403):
                self.closed_with, self.close_reason = REVOKED, f"HTTP {exc.status_code}"
        finally:
            self.ws = None

    async def _until_closed(self, task: Callable[[], Awaitable[None]], n: trio.Nursery) -> None:
        """Run one side of the bridge; its end (or the connection's) ends both sides."""
        try:
            await task()
        except ConnectionClosed as exc:
            if self.closed_with is None:
                self._closed(exc)
        n.cancel_scope.cancel()

    async def _handshake(self) -> p.HostHelloAck | None:
        assert self.ws is not None
        try:
            await self._send(p.encode(self.hello()))
            with trio.fail_after(HELLO_TIMEOUT):
                frame = p.decode(await self.ws.get_message())
            if not isinstance(frame, p.HostHelloAck):
                raise p.ProtocolError(f"expected the hello ack, got {frame.kind!r}")
        except trio.TooSlowError:
            self.last_error = f"no hello ack within {HELLO_TIMEOUT:g} s"
            return None
        except p.ProtocolError as exc:
            self.last_error = exc.reason
            return None
        self.ping_interval = frame.ping_interval
        log.info("host link: connected to %s (generation %d)", self.url, frame.generation)
        return frame

    async def _receive(self) -> None:
        assert self.ws is not None
        while True:
            with trio.move_on_after(max(self.ping_interval, 0.1) * SILENCE_PINGS) as silent:
                raw = await self.ws.get_message()
            if silent.cancelled_caught:
                self.last_error = "the server stopped answering"
                return
            try:
                frame = p.decode(raw)
            except p.ProtocolError as exc:
                self.last_error = f"bad frame from the server: {exc.reason}"
                log.warning("host link: %s", self.last_error)
                return
            if isinstance(frame, p.Ping):
                await self._send(p.encode(p.Pong(ts=frame.ts)))
            elif isinstance(frame, p.Pong):
                pass
            else:
                self.link.post(frame)

    async def _send_pending(self) -> None:
        while True:
            while not self.pending:
                self._more = trio.Event()
                await self._more.wait()
            await self._send(p.encode(self.pending[0]))
            self.pending.popleft()  # only once sent: a drop mid-send repeats it after the reconnect

    async def _send(self, text: str) -> None:
        assert self.ws is not None
        async with self._send_lock:
            await self.ws.send_message(text)

    def _closed(self, exc: ConnectionClosed) -> None:
        reason = exc.reason
        self.closed_with = reason.code if reason is not None else None
        self.close_reason = (reason.reason or "") if reason is not None else ""
        detail = f" ({self.close_reason})" if self.close_reason else ""
        self.last_error = f"closed with code {self.closed_with}{detail}"


def _why(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    text = f"{type(exc).__name__}: {cause}" if cause is not None else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())[:200]
