"""Several websocket messages in one write (`runner/ws_writes.py`), on trio-websocket over memory streams."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from trio_websocket import ConnectionClosed, wrap_client_stream, wrap_server_stream

from omnigent.runner.ws_writes import send_messages


class _Counted:
    """A stream that records each `send_all`: one entry per write to the socket."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.writes: list[bytes] = []

    async def send_all(self, data) -> None:
        self.writes.append(bytes(data))
        await self._stream.send_all(data)

    def __getattr__(self, name):
        return getattr(self._stream, name)


async def _pair(nursery, received: list, ready: trio.Event):
    client_stream, server_stream = trio.testing.memory_stream_pair()
    counted = _Counted(client_stream)

    async def server() -> None:
        request = await wrap_server_stream(nursery, server_stream)
        ws = await request.accept()
        ready.set()
        try:
            while True:
                received.append(await ws.get_message())
        except ConnectionClosed:
            return

    nursery.start_soon(server)
    client = await wrap_client_stream(nursery, counted, "localhost", "/")
    await ready.wait()
    return client, counted


async def test_messages_go_in_one_write_whole_and_in_order():
    received: list = []
    async with trio.open_nursery() as nursery:
        client, counted = await _pair(nursery, received, trio.Event())
        counted.writes.clear()
        await send_messages(client, ['{"kind":"turn.event"}', b"\x00bytes", '{"kind":"turn.completed"}'])
        assert len(counted.writes) == 1
        await send_messages(client, ["alone"])  # one message: trio-websocket's own send
        assert len(counted.writes) == 2
        await client.send_message("pong")  # what the receive loop sends meanwhile: its own write
        with trio.fail_after(5):
            while len(received) < 5:
                await trio.testing.wait_all_tasks_blocked()
        assert received == ['{"kind":"turn.event"}', b"\x00bytes", '{"kind":"turn.completed"}', "alone", "pong"]
        await client.aclose()
        with pytest.raises(ConnectionClosed):
            await send_messages(client, ["a", "b"])  # closed: as send_message says it
        nursery.cancel_scope.cancel()


async def test_a_connection_without_trio_websockets_internals_gets_a_send_each():
    sent: list = []

    class Plain:
        async def send_message(self, message) -> None:
            sent.append(message)

    await send_messages(Plain(), ["a", b"b", "c"])
    assert sent == ["a", b"b", "c"]
