"""The bare-ASGI websocket route (`server/asgi_socket.py`): what it promises at the edges.

Driven with scripted ASGI messages, no server: a send after the socket
closed is dropped, a close happens once, a route that ends without a close
gets 1000, a crash gets 1011 (logged), and a check that fails with anything
but an ApiError refuses the handshake with a 500 JSON answer.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import trio

from omnigent.server.asgi_socket import Socket, SocketGone, serve_socket
from omnigent.server.errors import ApiError

SCOPE = {"type": "websocket", "path": "/x/ws", "headers": [], "extensions": {"websocket.http.response": {}}}


def _peer(messages: list[dict]) -> tuple[Any, Any, list[dict]]:
    """An ASGI peer: `receive` gives `messages` then a disconnect; `send` records what it is sent."""
    pending = list(messages) + [{"type": "websocket.disconnect", "code": 1000}]
    sent: list[dict] = []

    async def receive() -> dict:
        return pending.pop(0)

    async def send(message: dict) -> None:
        sent.append(message)

    return receive, send, sent


async def test_a_closed_socket_sends_nothing_more_and_closes_once():
    receive, send, sent = _peer([{"type": "websocket.receive", "text": "hi"}])
    socket = Socket(receive, send)
    assert await socket.receive() == "hi"
    await socket.close(4003, "no")
    await socket.send("late")  # a send racing the close: dropped, not an error in hypercorn
    await socket.close(1000, "")
    assert sent == [{"type": "websocket.close", "code": 4003, "reason": "no"}]
    with pytest.raises(SocketGone):
        await socket.receive()


async def test_a_route_ending_without_a_close_is_closed_with_1000():
    receive, send, sent = _peer([{"type": "websocket.connect"}])

    async def serve(socket: Socket, headers: Any, prepared: str) -> None:
        await socket.send(prepared)

    with trio.fail_after(5):
        await serve_socket(SCOPE, receive, send, lambda headers: "prepared", serve)
    assert [m["type"] for m in sent] == ["websocket.accept", "websocket.send", "websocket.close"]
    assert sent[1]["text"] == "prepared" and sent[2]["code"] == 1000


async def test_a_peer_that_leaves_gets_nothing_more():
    receive, send, sent = _peer([{"type": "websocket.connect"}])

    async def serve(socket: Socket, headers: Any, prepared: None) -> None:
        await socket.receive()  # the disconnect: SocketGone

    with trio.fail_after(5):
        await serve_socket(SCOPE, receive, send, lambda headers: None, serve)
    assert [m["type"] for m in sent] == ["websocket.accept"]


async def test_a_crash_is_logged_and_closed_with_1011(caplog):
    receive, send, sent = _peer([{"type": "websocket.connect"}])

    async def serve(socket: Socket, headers: Any, prepared: None) -> None:
        raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR, logger="omnigent.server"), trio.fail_after(5):
        await serve_socket(SCOPE, receive, send, lambda headers: None, serve)
    assert [(m["type"], m.get("code")) for m in sent] == [("websocket.accept", None), ("websocket.close", 1011)]
    assert "unhandled error on WEBSOCKET /x/ws" in caplog.text


@pytest.mark.parametrize("error, status", [(ApiError("not_found", "Session not found"), 404),
                                           (RuntimeError("the store is gone"), 500)])
async def test_a_failed_check_refuses_the_handshake_with_json(error, status, caplog):
    receive, send, sent = _peer([{"type": "websocket.connect"}])

    def prepare(headers: Any) -> None:
        raise error

    async def serve(socket: Socket, headers: Any, prepared: None) -> None:
        raise AssertionError("never accepted, never served")

    with caplog.at_level(logging.ERROR, logger="omnigent.server"), trio.fail_after(5):
        await serve_socket(SCOPE, receive, send, prepare, serve)
    assert sent[0]["type"] == "websocket.http.response.start" and sent[0]["status"] == status
    assert json.loads(sent[1]["body"])["error"]["code"] == ("not_found" if status == 404 else "internal_error")
    assert ("unhandled error" in caplog.text) == (status == 500)
