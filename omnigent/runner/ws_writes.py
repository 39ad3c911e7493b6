"""Several websocket messages in one write to the socket.

Why: each `send_message` of trio-websocket is a write of its own, and each write
to the server wakes it. When a turn's deltas and its end are ready at once, the
first write let the server store and publish the deltas alone. One write hands
the server all of them in one read: it stores them in one transaction and writes
its watchers once (`outgoing.py` says what was measured).

What it guarantees: the messages go out whole and in order, under the
connection's own send lock, so a pong sent meanwhile from the receive loop
(`send_message`) goes before or after them, never inside. A closed or broken
connection raises `ConnectionClosed`, as `send_message` does.

How: trio-websocket 0.12 has no call for it; this uses its connection's
wsproto state, send lock and stream, as its own `_send` does. On a
trio-websocket without them (another minor: the range is pinned below 0.13),
or for a single message, it is `send_message` per message.
"""

from __future__ import annotations

from typing import Any

import trio
from trio_websocket import ConnectionClosed
from wsproto.events import BytesMessage, Message, TextMessage

_USES = ("_wsproto", "_stream_lock", "_stream", "_close_reason", "_abort_web_socket")


async def send_messages(ws: Any, messages: list[str | bytes]) -> None:
    """`messages` sent on `ws` (a trio-websocket connection) in order, in one write when it can."""
    if len(messages) != 1 and all(hasattr(ws, name) for name in _USES):
        await _send_together(ws, messages)
        return
    for message in messages:
        await ws.send_message(message)


async def _send_together(ws: Any, messages: list[str | bytes]) -> None:
    if ws._close_reason:
        raise ConnectionClosed(ws._close_reason)
    data = b"".join(ws._wsproto.send(_event(message)) for message in messages)
    async with ws._stream_lock:
        try:
            await ws._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            await ws._abort_web_socket()
            raise ConnectionClosed(ws._close_reason) from None


def _event(message: str | bytes) -> Message:
    if isinstance(message, str):
        return TextMessage(data=message)
    return BytesMessage(data=message)
