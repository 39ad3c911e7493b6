"""`connections`' task group: an event queued for the app costs no schedule point while the queue has room.

hypercorn queues each request body part, its end and each websocket message for the app
with `MemorySendChannel.send`, a schedule point each, though the queue has room; its
connection's reader now goes on to its next read, and the app takes what is queued when
it runs. A full queue still makes the reader wait, as hypercorn's did.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from omnigent.server import connections

AppTaskGroup = connections._task_group_class()
assert AppTaskGroup is not None


class _Config:
    max_app_queue_size = 2


async def test_the_apps_queue_takes_events_without_a_schedule_point_and_the_app_gets_them_in_order() -> None:
    got: list[Any] = []
    done = trio.Event()

    async def app(scope: Any, receive: Any, send: Any, *_: Any) -> None:
        for _ in range(2):
            got.append(await receive())
        done.set()

    async def app_send(message: Any) -> None:
        pass

    async with AppTaskGroup() as group:
        put = await group.spawn_app(app, _Config(), {"type": "http"}, app_send)
        await put({"type": "http.request", "body": b"{}", "more_body": True})
        await put({"type": "http.request", "body": b"", "more_body": False})
        assert got == []  # the app, runnable since spawn_app, has not run yet: the reader did not yield
        with trio.fail_after(5):
            await done.wait()
    assert [m["body"] for m in got] == [b"{}", b""]


async def test_a_full_queue_makes_the_reader_wait_until_the_app_takes_an_event(autojump_clock: Any) -> None:
    release = trio.Event()
    got: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any, *_: Any) -> None:
        await release.wait()
        for _ in range(3):
            got.append(await receive())

    async def app_send(message: Any) -> None:
        pass

    async with AppTaskGroup() as group:
        put = await group.spawn_app(app, _Config(), {"type": "websocket"}, app_send)
        await put(1)
        await put(2)  # the queue (2) is full now
        with trio.move_on_after(1) as waited:  # on the autojump clock: no real second
            await put(3)
        assert waited.cancelled_caught  # it waited for room, and was not queued
        release.set()
        with trio.fail_after(5):
            await put(3)
    assert got == [1, 2, 3]


async def test_the_app_takes_a_queued_event_without_a_schedule_point_and_waits_on_an_empty_queue(
        autojump_clock: Any) -> None:
    """The other end: a request's body already queued is read at once (each yield there was a task
    step of every post); an empty queue still waits, and a cancelled app still stops at its receive."""
    seen: list[Any] = []
    cancelled: list[bool] = []

    async def app(scope: Any, receive: Any, send: Any, *_: Any) -> None:
        ran: list[bool] = []

        async def witness() -> None:
            ran.append(True)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(witness)  # runnable now: it runs at the app's first yield
            seen.append(await receive())
            seen.append(await receive())
            cancelled.append(bool(ran))  # False: the app did not yield to take them
        with trio.move_on_after(1) as waited:
            seen.append(await receive())  # nothing queued: it waits
        cancelled.append(waited.cancelled_caught)
        with trio.CancelScope() as scope_:
            scope_.cancel()
            seen.append(await receive())  # queued by now, but the app was cancelled
        cancelled.append(scope_.cancelled_caught)

    async def app_send(message: Any) -> None:
        pass

    async with AppTaskGroup() as group:
        put = await group.spawn_app(app, _Config(), {"type": "http"}, app_send)
        await put("body")
        await put("end")
        await trio.sleep(2)  # past the app's wait for a third
        await put("late")
    assert seen == ["body", "end"]
    assert cancelled == [False, True, True]
