"""`omnigent.channels`: trio's channel send and receive without the yield where nothing waits."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from omnigent import channels


async def _ran_meanwhile(op: Any) -> tuple[Any, bool]:
    """`op`'s result, and whether a task made runnable just before it ran during it (a yield)."""
    ran: list[bool] = []

    async def witness() -> None:
        ran.append(True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(witness)
        result = await op
        yielded = bool(ran)
    return result, yielded


async def test_send_and_receive_pass_values_in_order_without_a_yield() -> None:
    send, receive = trio.open_memory_channel[int](2)
    assert (await _ran_meanwhile(channels.send(send, 1)))[1] is False
    assert (await _ran_meanwhile(channels.send(send, 2)))[1] is False
    assert await _ran_meanwhile(channels.receive(receive)) == (1, False)
    assert await _ran_meanwhile(channels.receive(receive)) == (2, False)


async def test_a_full_channel_makes_send_wait_and_an_empty_one_receive(autojump_clock: Any) -> None:
    send, receive = trio.open_memory_channel[int](1)
    await channels.send(send, 1)
    with trio.move_on_after(1) as full:
        await channels.send(send, 2)
    assert full.cancelled_caught
    assert await channels.receive(receive) == 1
    with trio.move_on_after(1) as empty:
        await channels.receive(receive)
    assert empty.cancelled_caught
    async with trio.open_nursery() as nursery:
        nursery.start_soon(channels.send, send, 3)
        assert await channels.receive(receive) == 3  # waited for it


async def test_a_cancelled_caller_stops_before_it_sends_or_takes_anything() -> None:
    send, receive = trio.open_memory_channel[int](2)
    await channels.send(send, 1)
    with trio.CancelScope() as scope:
        scope.cancel()
        await channels.send(send, 2)
    with trio.CancelScope() as scope:
        scope.cancel()
        await channels.receive(receive)
    assert receive.receive_nowait() == 1
    with pytest.raises(trio.WouldBlock):  # 2 was never sent
        receive.receive_nowait()


async def test_closed_channels_raise_as_trio_s_own() -> None:
    send, receive = trio.open_memory_channel[int](1)
    await receive.aclose()
    with pytest.raises(trio.BrokenResourceError):
        await channels.send(send, 1)
    send, receive = trio.open_memory_channel[int](1)
    await send.aclose()
    with pytest.raises(trio.EndOfChannel):
        await channels.receive(receive)
