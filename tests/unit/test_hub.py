"""The per-session event log: replay from a sequence number, eviction, live tail, close."""

import trio

from omnigent.server.hub import EventHub


async def test_replay_skips_evicted_events_then_follows_live():
    hub = EventHub(capacity=3)
    for n in range(5):
        hub.publish("s", "response.output_text.delta", turn_id="t", delta=str(n))
    seen: list[int] = []

    async def follow(after):
        async for event in hub.follow("s", after):
            seen.append(event["sequence_number"])

    async with trio.open_nursery() as n:
        n.start_soon(follow, 0)
        await trio.testing.wait_all_tasks_blocked()
        assert seen == [3, 4, 5]  # 1 and 2 fell out of the bounded log
        hub.publish("s", "session.heartbeat")
        hub.publish("other", "session.heartbeat")  # another session's log is not this one's
        await trio.testing.wait_all_tasks_blocked()
        assert seen == [3, 4, 5, 6]
        hub.close()
    assert hub.last_seq("s") == 6 and hub.last_seq("other") == 1


async def test_follow_without_after_is_live_only_and_from_the_middle_resumes():
    hub = EventHub()
    hub.publish("s", "session.heartbeat")
    hub.publish("s", "session.heartbeat")
    live: list[int] = []
    middle: list[int] = []

    async def follow(after, into):
        async for event in hub.follow("s", after):
            into.append(event["sequence_number"])

    async with trio.open_nursery() as n:
        n.start_soon(follow, None, live)
        n.start_soon(follow, 1, middle)
        await trio.testing.wait_all_tasks_blocked()
        hub.publish("s", "session.heartbeat")
        await trio.testing.wait_all_tasks_blocked()
        hub.close()
    assert live == [3] and middle == [2, 3]


async def test_an_event_is_encoded_once_however_many_watchers_send_it():
    import json

    from omnigent.server.memory_log import event_json

    hub = EventHub()
    texts: list[list[str]] = [[], [], []]

    async def watch(into):
        async for event in hub.follow("s", 0):
            into.append(event_json(event))

    async with trio.open_nursery() as n:
        for into in texts:
            n.start_soon(watch, into)
        await trio.testing.wait_all_tasks_blocked()
        published = hub.publish("s", "session.status", status="running")
        published["status"] = "changed by its publisher"  # before any watcher ran: the log has its own copy
        await trio.testing.wait_all_tasks_blocked()
        hub.publish("s", "session.status", status="idle")
        await trio.testing.wait_all_tasks_blocked()
        hub.close()
    first, *others = texts
    assert [json.loads(t)["status"] for t in first] == ["running", "idle"]
    assert all(t == first for t in others)
    assert all(a is b for other in others for a, b in zip(first, other))  # one str per event


async def test_a_running_hub_collects_garbage_less_often():
    import gc

    from omnigent.config.collector import THRESHOLDS

    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)  # CPython's default (an earlier test's hub may have set them)
    hub = EventHub()
    try:
        async with trio.open_nursery() as n:
            await n.start(hub.run)
            assert gc.get_threshold() == THRESHOLDS
            n.cancel_scope.cancel()
    finally:
        gc.set_threshold(*before)


async def test_a_running_hub_collects_while_the_loop_waits_and_not_once_it_stopped():
    import gc

    from omnigent.config.collector import IDLE_AT, IDLE_WAIT
    from tests.support.collections import only_explicit_collections

    before = gc.get_threshold()
    hub = EventHub()
    try:
        async with trio.open_nursery() as n:
            await n.start(hub.run)
            with only_explicit_collections() as collections:
                kept = [[] for _ in range(IDLE_AT + 100)]
                await trio.sleep(IDLE_WAIT * 4)  # the loop waits with nothing to run
                assert collections, "no collection while the loop waited"
            n.cancel_scope.cancel()
        with only_explicit_collections() as collections:
            kept += [[] for _ in range(IDLE_AT + 100)]
            await trio.sleep(IDLE_WAIT * 4)
            assert collections == []  # the hub is gone: its instrument too
    finally:
        gc.set_threshold(*before)
