"""`connections`' HTTP/1.1: a sized answer's head goes out with its body, a streamed one's at once.

The protocol is driven directly with hypercorn's stream events; its writes are recorded.
"""

from __future__ import annotations

from typing import Any

from hypercorn.events import RawData
from hypercorn.protocol.events import Body, EndBody, Response, StreamClosed
from hypercorn.trio.worker_context import WorkerContext

from omnigent.server import connections

H11 = connections._h11_class()
assert H11 is not None


async def _protocol() -> tuple[Any, list[bytes]]:
    writes: list[bytes] = []

    async def send(event: Any) -> None:
        if isinstance(event, RawData) and event.data:
            writes.append(event.data)

    protocol = H11(None, connections.Config(), WorkerContext(None), None, None, False,
                   ("127.0.0.1", 1), ("127.0.0.1", 2), send)
    protocol.connection.receive_data(b"POST /x HTTP/1.1\r\nHost: test\r\n\r\n")
    protocol.connection.next_event()  # the request
    protocol.connection.next_event()  # its (empty) end
    return protocol, writes


async def test_a_sized_answer_is_one_write_of_its_head_and_body() -> None:
    protocol, writes = await _protocol()
    await protocol.stream_send(Response(stream_id=1, status_code=202, headers=[(b"content-length", b"2")]))
    assert writes == []
    await protocol.stream_send(Body(stream_id=1, data=b"{}"))
    await protocol.stream_send(EndBody(stream_id=1))
    assert len(writes) == 1
    assert writes[0].startswith(b"HTTP/1.1 202 ")
    assert writes[0].endswith(b"\r\n\r\n{}")


async def test_a_streamed_answer_has_its_head_written_at_once() -> None:
    protocol, writes = await _protocol()
    await protocol.stream_send(Response(stream_id=1, status_code=200,
                                        headers=[(b"content-type", b"text/event-stream")]))
    assert len(writes) == 1 and writes[0].startswith(b"HTTP/1.1 200 ")
    await protocol.stream_send(Body(stream_id=1, data=b"data: {}\n\n"))
    assert writes[1] == b"a\r\ndata: {}\n\n\r\n"


async def test_a_held_head_is_written_when_the_app_leaves_mid_answer() -> None:
    protocol, writes = await _protocol()
    await protocol.stream_send(Response(stream_id=1, status_code=200, headers=[(b"content-length", b"5")]))
    await protocol.stream_send(StreamClosed(stream_id=1))
    assert len(writes) == 1 and writes[0].startswith(b"HTTP/1.1 200 ")
