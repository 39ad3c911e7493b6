"""trio memory channels passed without a schedule point where the channel needs no wait.

Why: `MemorySendChannel.send` and `MemoryReceiveChannel.receive` always yield to
the scheduler, even when the channel has room or holds a value. Each yield is a
task step: a pass through trio's run loop and an `epoll_wait`. A turn hands
frames and events through a handful of channels on the server and in the
runner, and those yields were a quarter of a lone turn's task steps.

What they guarantee, against trio's own `send` / `receive`:
- the same values in the same order, and the same waiting when the channel is
  full (send) or empty (receive), through trio's own call;
- the same cancellation: a caller whose scope is cancelled stops here
  (`checkpoint_if_cancelled`), and a value is never half sent or lost;
- the same errors for a closed or broken channel.
What they drop is only the yield after an operation that did not have to wait:
a loop that passes values without ever waiting must have a schedule point of
its own elsewhere (each caller here waits for the next frame, event or answer).
"""

from __future__ import annotations

from typing import TypeVar

import trio

T = TypeVar("T")


async def send(channel: trio.MemorySendChannel[T], value: T) -> None:
    """`channel.send(value)`, without its schedule point while the channel has room."""
    await trio.lowlevel.checkpoint_if_cancelled()
    try:
        channel.send_nowait(value)
    except trio.WouldBlock:
        await channel.send(value)


async def receive(channel: trio.MemoryReceiveChannel[T]) -> T:
    """`channel.receive()`, without its schedule point while the channel holds a value."""
    await trio.lowlevel.checkpoint_if_cancelled()
    try:
        return channel.receive_nowait()
    except trio.WouldBlock:
        return await channel.receive()
