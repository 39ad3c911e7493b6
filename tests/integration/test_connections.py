"""hypercorn's connections as `omnigent.server.connections` serves them: keep-alive, the idle
timeout as a deadline, and a server that stops while connections are idle, busy or abandoned.

Real sockets and the real clock. The keep-alive timeout is short (0.3 s) and the graceful timeout
long (30 s), so a watcher that never ends shows as a `serve` that does not return in time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from hypercorn.trio import serve

from omnigent.server import connections

KEEP_ALIVE = 0.3


class _Server:
    """A hypercorn server on our connections, and the events its test and app share."""

    def __init__(self) -> None:
        self.port = 0
        self.stop = trio.Event()  # the server's shutdown trigger
        self.stopped = trio.Event()  # serve() has returned
        self.held = trio.Event()  # /held answers once it is set
        self.entered = trio.Event()  # /held or /gone has its request
        self.left = trio.Event()  # /gone has seen its client leave


def _app(server: _Server) -> Callable[..., Any]:
    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                kind = (await receive())["type"].rsplit(".", 1)[1]  # startup, shutdown
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        path = scope["path"]
        while (await receive()).get("more_body"):
            pass
        if path == "/held":  # answers once the test lets it
            server.entered.set()
            await server.held.wait()
        elif path == "/gone":  # waits for its client to leave
            server.entered.set()
            while (await receive())["type"] != "http.disconnect":
                pass
            server.left.set()
            return
        elif path == "/slow":  # busy for longer than the keep-alive timeout
            await trio.sleep(3 * KEEP_ALIVE)
        if path == "/chunked":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"one ", "more_body": True})
            await send({"type": "http.response.body", "body": b"two"})
            return
        body = path.encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app


@asynccontextmanager
async def _serving(keep_alive: float = KEEP_ALIVE, first_request: float = KEEP_ALIVE) -> AsyncIterator[_Server]:
    assert connections.install()
    config = connections.Config()
    config.bind = ["127.0.0.1:0"]
    config.keep_alive_timeout = keep_alive
    config.first_request_timeout = first_request
    config.graceful_timeout = 30.0
    config.accesslog = None
    server = _Server()

    async def run(task_status: trio.TaskStatus[list[str]]) -> None:
        try:
            await serve(_app(server), config, shutdown_trigger=server.stop.wait,
                        task_status=task_status)
        finally:
            server.stopped.set()

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(run)
        server.port = int(binds[0].rsplit(":", 1)[1])
        try:
            yield server
        finally:
            server.stop.set()
            server.held.set()
            with trio.fail_after(10):
                await server.stopped.wait()


async def _request(stream: trio.SocketStream, path: str) -> None:
    await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())


async def _response(stream: trio.SocketStream, buffer: bytearray) -> bytes:
    """One whole response (sized or chunked) read off the connection; what follows stays in buffer."""
    while True:
        head_end = buffer.find(b"\r\n\r\n")
        if head_end >= 0:
            head = bytes(buffer[:head_end]).lower()
            if b"content-length:" in head:
                length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
                end = head_end + 4 + length
            else:
                end = buffer.find(b"\r\n0\r\n\r\n", head_end) + len(b"\r\n0\r\n\r\n")
                end = end if end >= len(b"\r\n0\r\n\r\n") else -1
            if 0 <= end <= len(buffer):
                answer = bytes(buffer[:end])
                del buffer[:end]
                return answer
        data = await stream.receive_some()
        assert data, f"the connection closed before a whole response: {bytes(buffer)!r}"
        buffer += data


async def _closed(stream: trio.SocketStream) -> None:
    while await stream.receive_some():
        pass


async def test_keep_alive_serves_requests_in_turn_then_closes_once_idle_for_its_timeout() -> None:
    async with _serving() as server:
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        buffer = bytearray()
        for path in ("/one", "/chunked", "/two"):
            await _request(stream, path)
            with trio.fail_after(5):
                answer = await _response(stream, buffer)
            assert answer.startswith(b"HTTP/1.1 200")
            assert b"\r\ndate: " in answer.lower()
        assert answer.endswith(b"\r\n\r\n/two")
        idle_since = trio.current_time()
        with trio.fail_after(10):
            await _closed(stream)
        assert trio.current_time() - idle_since >= KEEP_ALIVE * 0.9
        await stream.aclose()


async def test_an_answered_connection_waits_longer_for_its_next_request_than_a_new_one_for_its_first() -> None:
    keep_alive = 6 * KEEP_ALIVE  # the silent one must close well before: room for a loaded machine
    async with _serving(keep_alive=keep_alive, first_request=KEEP_ALIVE) as server:
        opened = trio.current_time()
        silent = await trio.open_tcp_stream("127.0.0.1", server.port)
        answered = await trio.open_tcp_stream("127.0.0.1", server.port)
        buffer = bytearray()
        await _request(answered, "/one")
        with trio.fail_after(5):
            await _response(answered, buffer)
        with trio.fail_after(5):
            await _closed(silent)
        assert KEEP_ALIVE * 0.9 <= trio.current_time() - opened < keep_alive * 0.9
        await _request(answered, "/two")  # still open: the silent one's timeout is not its own
        with trio.fail_after(5):
            assert (await _response(answered, buffer)).endswith(b"/two")
        idle_since = trio.current_time()
        with trio.fail_after(10):
            await _closed(answered)
        assert trio.current_time() - idle_since >= keep_alive * 0.9
        await silent.aclose()
        await answered.aclose()


async def test_a_chunked_answer_arrives_whole() -> None:
    async with _serving() as server:
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        await _request(stream, "/chunked")
        with trio.fail_after(5):
            answer = await _response(stream, bytearray())
        assert b"transfer-encoding: chunked" in answer.lower()
        assert answer.endswith(b"4\r\none \r\n3\r\ntwo\r\n0\r\n\r\n")
        await stream.aclose()


async def test_a_request_busy_for_longer_than_the_timeout_is_answered_and_the_connection_kept() -> None:
    async with _serving() as server:
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        buffer = bytearray()
        await _request(stream, "/slow")
        with trio.fail_after(10):
            assert (await _response(stream, buffer)).endswith(b"/slow")
        await _request(stream, "/after")
        with trio.fail_after(5):
            assert (await _response(stream, buffer)).endswith(b"/after")
        await stream.aclose()


async def test_stopping_closes_idle_connections_and_finishes_the_busy_ones() -> None:
    async with _serving() as server:
        idle = await trio.open_tcp_stream("127.0.0.1", server.port)
        await _request(idle, "/warm")
        with trio.fail_after(5):
            await _response(idle, bytearray())
        busy = await trio.open_tcp_stream("127.0.0.1", server.port)
        await _request(busy, "/held")
        with trio.fail_after(5):
            await server.entered.wait()
        server.stop.set()
        with trio.fail_after(KEEP_ALIVE * 0.9):  # at once, not when its keep-alive runs out
            await _closed(idle)
        server.held.set()
        with trio.fail_after(5):
            assert (await _response(busy, bytearray())).endswith(b"/held")
            await _closed(busy)  # and then closed: the server is stopping
            await server.stopped.wait()  # well before its graceful timeout (30 s)
        await idle.aclose()
        await busy.aclose()


async def test_a_client_that_leaves_mid_request_leaves_nothing_waiting() -> None:
    async with _serving() as server:
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        await _request(stream, "/gone")
        with trio.fail_after(5):
            await server.entered.wait()
        await stream.aclose()
        with trio.fail_after(5):
            await server.left.wait()
        server.stop.set()
        with trio.fail_after(5):  # a watcher left waiting would hold it for the graceful 30 s
            await server.stopped.wait()


def test_a_hypercorn_without_what_they_override_keeps_its_own_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections, "_TCP_SERVER_USES", (*connections._TCP_SERVER_USES, "_gone"))
    assert connections._connection_class() is None
    monkeypatch.setattr(connections, "_H11_USES", ("_gone",))
    assert connections._h11_class() is None
    monkeypatch.setattr(connections, "_TASK_GROUP_USES", ("_gone",))
    assert connections._task_group_class() is None


def test_installed_a_connection_opens_the_task_group_that_queues_without_a_schedule_point() -> None:
    import hypercorn.trio.tcp_server as tcp_server

    assert connections.install()
    assert tcp_server.TaskGroup.__name__ == "AppTaskGroup"
