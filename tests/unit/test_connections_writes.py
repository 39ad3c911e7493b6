"""`connections.Connection`'s writes: what the socket takes at once goes without a schedule point,
at most once per `DIRECT_WRITE_EVERY` per connection; the rest, and every other write, as
hypercorn's (`send_all`). Real sockets on localhost, trio's mock clock (nothing here times out).

Why: trio's `send_all` yields after every successful send, and a lone turn's four writes (the
post's answer, the step to the runner, the stream's events) were four of its 19 task steps in
the server.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing
from hypercorn.events import Closed, RawData

from omnigent.server import connections

Connection = connections._connection_class()
assert Connection is not None


class _Protocol:
    def __init__(self) -> None:
        self.events: list[Any] = []

    async def handle(self, event: Any) -> None:
        self.events.append(event)


@asynccontextmanager
async def _connected() -> AsyncIterator[tuple[Any, trio.SocketStream]]:
    """A Connection on the server's end of a localhost TCP pair, and the client's end."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    server = await listeners[0].accept()
    conn = Connection(None, connections.Config(), None, None, server)
    conn.protocol = _Protocol()
    try:
        yield conn, client
    finally:
        await client.aclose()
        await server.aclose()
        await listeners[0].aclose()


async def _read(client: trio.SocketStream, size: int) -> bytes:
    got = b""
    while len(got) < size:
        got += await client.receive_some(size - len(got))
    return got


async def test_a_write_goes_without_a_schedule_point_and_the_next_within_the_interval_with_one(
        autojump_clock: Any) -> None:
    async with _connected() as (conn, client):
        with trio.testing.assert_no_checkpoints():
            await conn.protocol_send(RawData(data=b"first"))
        with trio.testing.assert_checkpoints():  # a loop's next write yields, as send_all does
            await conn.protocol_send(RawData(data=b"second"))
        await trio.sleep(connections.DIRECT_WRITE_EVERY)
        with trio.testing.assert_no_checkpoints():
            await conn.protocol_send(RawData(data=b"third"))
        assert await _read(client, 16) == b"firstsecondthird"
        assert conn.protocol.events == []


async def test_what_the_socket_does_not_take_at_once_follows_in_order(autojump_clock: Any) -> None:
    """A write larger than the socket's buffers, to a client not reading yet: the part written at
    once, then the rest by `send_all`, which waits for the client."""
    data = bytes(range(256)) * (32 * 1024)  # 8 MiB
    async with _connected() as (conn, client):
        received: list[bytes] = []

        async def read() -> None:
            received.append(await _read(client, len(data)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.protocol_send, RawData(data=data))
            await trio.testing.wait_all_tasks_blocked()  # the write waits: the buffers are full
            nursery.start_soon(read)
        assert received == [data]


async def test_a_peer_gone_is_a_closed_connection(autojump_clock: Any) -> None:
    async with _connected() as (conn, client):
        await client.aclose()
        for _ in range(3):  # the first writes may still be taken; a later one fails
            await trio.sleep(connections.DIRECT_WRITE_EVERY)
            await conn.protocol_send(RawData(data=b"x" * 1024))
            if conn.protocol.events:
                break
        assert conn.protocol.events and isinstance(conn.protocol.events[0], Closed)


async def test_a_tls_stream_is_written_by_send_all_only(autojump_clock: Any) -> None:
    """hypercorn's stream of a TLS connection is a trio.SSLStream over the socket: its bytes must go
    through TLS, so nothing is written to the socket beneath it directly."""
    async with _connected() as (plain, _client):
        tls = trio.SSLStream(plain.stream, ssl.create_default_context(ssl.Purpose.CLIENT_AUTH), server_side=True)
        conn = Connection(None, connections.Config(), None, None, tls)
        assert conn._write_now(b"x") == 0
