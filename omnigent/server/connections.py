"""hypercorn's handling of a connection, with fewer task steps and writes per request.

hypercorn 0.18 spends, on every request of a keep-alive connection:
- a task for the keep-alive timeout: cancelled when a request arrives, a new one
  started when its response has gone (`TrioSingleTask`: a lock, a cancel, a
  `Nursery.start`);
- a schedule point to take its uncontended send lock, before the send's own;
- two writes for an answer, its head and its body, and a third, empty one that
  ends a sized body (still the lock, a shielded scope and a checkpoint);
- a schedule point for each event it queues for the app (a request's body and
  its end, each websocket message), though the queue has room, and one for each
  the app takes, though one is queued;
- a schedule point after every write (trio's `send_all` yields after a send that
  the socket took whole).

A turn is a post and two server-sent events, the TurnStart's websocket write and
the runner's answer: these made 17 of a lone turn's 36 task steps in the server
(a lone turn now takes 13 in all), ~3 % of its CPU for the timeout alone in a profile.

`Connection` (hypercorn's `TCPServer`) keeps the timeout as one watcher task per
connection and a deadline it moves:
- idle: the deadline is `keep_alive_timeout` away (`first_request_timeout` for a
  connection that has not yet sent a request); when it passes, or the server
  stops, the connection closes (as hypercorn's `_idle_timeout`);
- busy (a request in flight, a websocket open): no deadline; if the server stops
  meanwhile, the response is still finished and h11 then closes the connection
  (its `_maybe_recycle` sees the server terminated);
- once the client has gone (reading ended), the watcher ends with it, so the
  connection's task group never waits on it.
It writes without the lock's schedule point when nobody holds it, skips empty
writes, and writes what the socket takes at once without trio's schedule point
after it, at most once a millisecond (`DIRECT_WRITE_EVERY`): a loop of writes with
no schedule point of its own still yields at each after its first.

`H11` (hypercorn's `H11Protocol`) holds a sized answer's head until its
first body bytes, so the two go as one write. `Config` formats the Date header
once a second, not once a response, and keeps an answered client's connection
for `KEEP_ALIVE` (see there). `AppTaskGroup` (hypercorn's `TaskGroup`) queues an
event for the app without a schedule point while the queue has room, and the app
takes one that is queued without one: the reader goes on to its next read, and
the app reads a request's body as soon as it runs.

`install()` puts them where `hypercorn.trio.serve` builds its connections. They
subclass hypercorn's internals: pyproject.toml pins the minor version they were
written against, and a hypercorn whose classes lack what they override or call
keeps its own.
"""

from __future__ import annotations

import functools
import math
import os
import time
from typing import Any
from wsgiref.handlers import format_date_time

import trio
from hypercorn.config import Config as _HypercornConfig

from .. import channels

# what the subclasses below override or call of hypercorn 0.18's classes: a hypercorn without
# all of them is not the one they were written for (pyproject.toml pins the minor; asking the
# installed version through importlib.metadata would cost every server start ~14 ms)
# (`run` is the caller of `idle_task.restart(..., self._idle_timeout)`; `Connection` overrides the rest
# or calls them)
_TCP_SERVER_USES = ("run", "protocol_send", "_idle_timeout", "_read_data", "_initiate_server_close")
_H11_USES = ("stream_send", "_send_h11_event")
_TASK_GROUP_USES = ("spawn_app",)


# How long a connection that has been answered stays open, idle, for the client's next request.
# hypercorn's 5 s is shorter than a person's pause between two turns, so every prompt paid a new
# connection (a TLS handshake too, to a remote server), and it equals httpx's own idle expiry, so
# a client could reuse a connection just as the server closed it. The SDK's pool
# (`omnigent.client._http.KEEPALIVE_EXPIRY`, 60 s) lets go first.
KEEP_ALIVE = 75.0
# A new connection that has sent no request yet is held as hypercorn held it: a socket that
# never speaks costs the server a task and a file descriptor, and earns nothing.
FIRST_REQUEST = 5.0


# A connection writes to its socket without a schedule point at most once in this many seconds
# (`Connection._write_now`): a turn's writes to one connection (a post's answer, a step, the
# stream's events) are milliseconds apart, a loop's are not.
DIRECT_WRITE_EVERY = 0.001


def _fits(cls: type, names: tuple[str, ...]) -> bool:
    return all(callable(getattr(cls, name, None)) for name in names)


class _IdleDeadline:
    """hypercorn's `SingleTask` interface, as the deadline of the connection's one watcher.

    `restart` (the connection went idle) moves the deadline away and, the first time (the
    connection is new), starts the watcher: `first` then, `timeout` after an answer;
    `stop` (a request came in) removes the deadline."""

    def __init__(self, timeout: float, first: float) -> None:
        self.timeout = timeout
        self.first = first
        self.scope = trio.CancelScope()
        self.ended = False  # reading ended: the connection is done, and the watcher with it
        self._started = False

    @property
    def busy(self) -> bool:
        return self.scope.deadline == math.inf

    async def restart(self, task_group: Any, action: Any) -> None:
        if self._started:
            self.scope.deadline = trio.current_time() + self.timeout
            return
        self.scope.deadline = trio.current_time() + self.first
        self._started = True
        task_group._nursery.start_soon(action)

    async def stop(self) -> None:
        self.scope.deadline = math.inf

    def end(self) -> None:
        self.ended = True
        self.scope.cancel()


def _connection_class() -> type | None:
    from hypercorn.events import Closed, RawData
    from hypercorn.trio.tcp_server import TCPServer

    if not _fits(TCPServer, _TCP_SERVER_USES):
        return None

    class Connection(TCPServer):  # type: ignore[misc, valid-type]
        """One TCP connection, its keep-alive timeout a moving deadline (see the module)."""

        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            config = self.config
            self._idle = _IdleDeadline(config.keep_alive_timeout,
                                       getattr(config, "first_request_timeout", config.keep_alive_timeout))
            self.idle_task = self._idle  # type: ignore[assignment]  # hypercorn's run() restarts it
            # a plain TCP stream (not TLS) can be written to directly (`_write_now`)
            self._socket = self.stream.socket if isinstance(self.stream, trio.SocketStream) else None
            self._direct_after = -math.inf  # `_write_now` writes again once the clock is past this

        async def protocol_send(self, event: Any) -> None:
            if type(event) is not RawData:
                await super().protocol_send(event)
                return
            if not event.data:
                return  # the end of a sized body: nothing to write
            # hypercorn's own write, but an uncontended lock taken without a schedule point:
            # the send itself is one, and each was a task step of every write
            try:
                self.send_lock.acquire_nowait()
            except trio.WouldBlock:
                await self.send_lock.acquire()
            try:
                data = event.data
                written = self._write_now(data)
                if written < len(data):
                    with trio.CancelScope(shield=True):
                        await self.stream.send_all(memoryview(data)[written:])
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                await self.protocol.handle(Closed())
            finally:
                self.send_lock.release()

        def _write_now(self, data: bytes) -> int:
            """Write what the socket takes at once, without trio's schedule point after a send;
            returns how much (0: none, `send_all` writes it all). The caller holds the send lock.

            At most once per `DIRECT_WRITE_EVERY` per connection: a route that writes in a loop
            with no other schedule point (an SSE replay of a long log) still yields at each
            write after its first, as every write did."""
            if self._socket is None:
                return 0
            now = trio.current_time()
            if now < self._direct_after:
                return 0
            fd = self._socket.fileno()
            if fd < 0:
                return 0  # closed: send_all says so
            try:
                written = os.write(fd, data)  # nonblocking, as trio keeps every socket
            except BlockingIOError:
                return 0
            except OSError as exc:  # the peer is gone: as send_all would say it
                raise trio.BrokenResourceError(f"socket write failed: {exc}") from exc
            self._direct_after = now + DIRECT_WRITE_EVERY
            return written

        async def _idle_timeout(self) -> None:
            idle = self._idle
            with idle.scope:  # cancelled by its deadline: idle for keep_alive_timeout
                await self.context.terminated.wait()
                if idle.busy:  # the server stops mid-request: h11 closes after the response
                    await trio.sleep_forever()
            if idle.ended:
                return  # the client left or the connection closed: run() closes what is left
            # idle for keep_alive_timeout or the server stops (also when a request came in just
            # as the deadline passed, as hypercorn's own task closes then)
            with trio.CancelScope(shield=True):
                await self._initiate_server_close()

        async def _read_data(self) -> None:
            try:
                await super()._read_data()
            finally:
                self._idle.end()  # the client is gone or the connection closed

    return Connection


def _h11_class() -> type | None:
    import h11
    from hypercorn.events import RawData
    from hypercorn.protocol.events import StreamClosed
    from hypercorn.protocol.h11 import H11Protocol

    if not _fits(H11Protocol, _H11_USES):
        return None

    class H11(H11Protocol):  # type: ignore[misc, valid-type]
        """hypercorn's HTTP/1.1, writing a sized response's head with its first body bytes.

        An answer is a start and a body from the app: two writes, two task steps and two
        segments for the client to read. A head that says its `content-length` waits for the
        next bytes of its response (it is of no use to the client without them); a streamed
        answer (server-sent events) has no length, and its head goes at once."""

        _head = b""

        async def _send_h11_event(self, event: Any) -> None:
            try:
                data = self.connection.send(event)
            except h11.LocalProtocolError:
                if self.connection.their_state != h11.ERROR:
                    raise
                return
            if isinstance(event, h11.Response) and _sized(event.headers):
                self._head = data
                return
            if self._head:
                data, self._head = self._head + data, b""
            await self.send(RawData(data=data))

        async def stream_send(self, event: Any) -> None:
            if self._head and isinstance(event, StreamClosed):  # the app left mid-answer
                head, self._head = self._head, b""
                await self.send(RawData(data=head))
            await super().stream_send(event)

    return H11


def _task_group_class() -> type | None:
    from hypercorn.trio import task_group
    from hypercorn.trio.task_group import TaskGroup

    handle: Any = getattr(task_group, "_handle", None)  # the app's task, which spawn_app starts
    if not _fits(TaskGroup, _TASK_GROUP_USES) or not callable(handle):
        return None

    class AppTaskGroup(TaskGroup):  # type: ignore[misc, valid-type]
        """hypercorn's task group, whose queue between a connection and its app passes an event
        without a schedule point on either side while it can (a full queue still makes the
        reader wait, and an empty one the app, as hypercorn's)."""

        async def spawn_app(self, app: Any, config: Any, scope: Any, send: Any) -> Any:
            # hypercorn's spawn_app, with each end of its channel wrapped
            to_app, from_server = trio.open_memory_channel[Any](config.max_app_queue_size)
            nursery = self._nursery  # set by the group's __aenter__
            assert nursery is not None
            nursery.start_soon(handle, app, config, scope, functools.partial(channels.receive, from_server),
                               send, trio.to_thread.run_sync, trio.from_thread.run)
            return functools.partial(channels.send, to_app)

    return AppTaskGroup


def _sized(headers: Any) -> bool:
    return any(name == b"content-length" for name, _ in headers)


class Config(_HypercornConfig):
    """hypercorn's Config, whose Date header is formatted once a second (its resolution), not
    once a response, and whose connections wait `KEEP_ALIVE` for a client's next request
    (`FIRST_REQUEST` for its first)."""

    def __init__(self) -> None:
        super().__init__()
        self.keep_alive_timeout = KEEP_ALIVE
        self.first_request_timeout = FIRST_REQUEST
        self.include_date_header = False  # response_headers adds it
        self._date = (0, b"")

    def response_headers(self, protocol: str) -> list[tuple[bytes, bytes]]:
        now = int(time.time())  # the wall clock, as hypercorn's own header
        if self._date[0] != now:
            self._date = (now, format_date_time(now).encode("ascii"))
        return [(b"date", self._date[1]), *super().response_headers(protocol)]


def install() -> bool:
    """Have `hypercorn.trio.serve` use `Connection`, `H11` and `AppTaskGroup` (idempotent). False:
    a hypercorn whose classes lack what they override or call, which keeps its own."""
    import hypercorn.trio.run as run

    if getattr(run.TCPServer, "_omnigent", False):
        return True
    connection, h11, task_group = _connection_class(), _h11_class(), _task_group_class()
    if connection is None or h11 is None or task_group is None:
        return False
    import hypercorn.protocol as protocols
    import hypercorn.trio.tcp_server as tcp_server

    connection._omnigent = True  # type: ignore[attr-defined]
    run.TCPServer = connection  # type: ignore[misc, assignment]
    protocols.H11Protocol = h11  # type: ignore[misc, assignment]
    tcp_server.TaskGroup = task_group  # type: ignore[misc, assignment]  # what TCPServer.run opens per connection
    return True
