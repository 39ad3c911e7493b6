"""The stored event log behind the hub: numbering across processes and restarts, batching,
atomic events, compaction, resync and heartbeats (virtual time where time matters)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
import trio
import trio.testing

from protocol import events as ev
from omnigent.server.hub import EventHub
from omnigent.store import Store

OLD_STORE = Path(__file__).parent.parent / "resources" / "stores" / "chat-0.1.0.db"


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "chat.db") as s:
        yield s


def new_session(store: Store) -> str:
    return store.create_conversation(agent_id=None)["id"]


async def collect(hub: EventHub, sid: str, after: int | None, into: list, **kw) -> None:
    async for event in hub.follow(sid, after, **kw):
        into.append(event)


def seqs(events: list[dict]) -> list[int]:
    return [e["sequence_number"] for e in events]


async def test_numbers_are_unique_across_two_stores_on_one_file_and_survive_a_restart(tmp_path):
    path = tmp_path / "chat.db"
    with Store(path) as a, Store(path) as b:
        sid = new_session(a)
        hub_a, hub_b = EventHub(a), EventHub(b)
        seen: list[dict] = []
        async with trio.open_nursery() as n:
            n.start_soon(collect, hub_a, sid, 0, seen)
            for i in range(6):  # two processes publishing to one session in turn
                (hub_a if i % 2 == 0 else hub_b).publish(sid, ev.SESSION_STATUS, status=f"s{i}")
                await trio.testing.wait_all_tasks_blocked()
            hub_a.close()
        stored = a.read_events(sid, 0)
        assert seqs(stored) == [1, 2, 3, 4, 5, 6]
        assert [e["status"] for e in stored] == [f"s{i}" for i in range(6)]
        # A's follower read B's events from the store when it met the holes in its own numbers
        assert seqs(seen) == [1, 2, 3, 4, 5] and [e["status"] for e in seen] == [f"s{i}" for i in range(5)]
    with Store(path) as again:  # a restarted server goes on numbering, and replays
        hub = EventHub(again)
        assert hub.last_seq(sid) == 6
        assert hub.publish(sid, ev.SESSION_STATUS, status="after")["sequence_number"] == 7
        replay: list[dict] = []
        async with trio.open_nursery() as n:
            n.start_soon(collect, hub, sid, 4, replay)
            await trio.testing.wait_all_tasks_blocked()
            hub.close()
        assert seqs(replay) == [5, 6, 7]


async def test_deltas_are_batched_stored_before_published_and_kept_in_order(store, autojump_clock):
    hub = EventHub(store, batch_interval=0.02)
    sid = new_session(store)
    seen: list[dict] = []
    stored_when_seen: list[int] = []

    async def follow() -> None:
        async for event in hub.follow(sid, 0):
            stored_when_seen.append(len(store.read_events(sid, 0)))
            seen.append(event)

    async with trio.open_nursery() as n:
        await n.start(hub.run)
        n.start_soon(follow)
        await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        for i in range(50):  # a burst, on a hub that wrote nothing lately: together, at once
            hub.publish(sid, ev.TEXT_DELTA, turn_id="turn_1", delta=str(i))
        assert store.read_events(sid, 0) == []  # buffered: not stored, so not published yet
        await trio.testing.wait_all_tasks_blocked()
        assert trio.current_time() == start and len(seen) == 50
        assert min(stored_when_seen) == 50  # each stored before it was seen
        for i in range(3):  # right behind a write: held until batch_interval after it
            hub.publish(sid, ev.TEXT_DELTA, turn_id="turn_1", delta=f"next{i}")
        await trio.sleep(0.019)
        assert len(seen) == 50
        await trio.sleep(0.0011)
        assert len(seen) == 53  # by 20.1 ms
        await trio.sleep(0.05)  # quiet again: the next delta goes at once
        quiet = trio.current_time()
        hub.publish(sid, ev.TEXT_DELTA, turn_id="turn_1", delta="after a pause")
        await trio.testing.wait_all_tasks_blocked()
        assert trio.current_time() == quiet and len(seen) == 54
        for i in range(3):
            hub.publish(sid, ev.TEXT_DELTA, turn_id="turn_1", delta=f"late{i}")
        hub.publish(sid, ev.ITEM_DONE, turn_id="turn_1", item={"type": "message"})  # flushes first
        await trio.testing.wait_all_tasks_blocked()
        assert trio.current_time() == quiet and len(seen) == 58
        n.cancel_scope.cancel()
    assert seqs(seen) == list(range(1, 59))
    assert [e["type"] for e in seen[-4:]] == [ev.TEXT_DELTA] * 3 + [ev.ITEM_DONE]
    assert seqs(store.read_events(sid, 0)) == list(range(1, 59))


async def test_a_relayed_item_alone_waits_a_whole_interval_for_what_follows_it(store, autojump_clock):
    hub = EventHub(store, batch_interval=0.02)
    sid = new_session(store)
    seen: list[dict] = []
    async with trio.open_nursery() as n:
        await n.start(hub.run)
        n.start_soon(collect, hub, sid, 0, seen)
        await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        hub.publish_soon(sid, ev.ITEM_DONE, turn_id="turn_1", item={"type": "message"})
        await trio.sleep(0.019)
        assert seen == []  # the step's end usually takes it along before then
        await trio.sleep(0.0011)
        assert len(seen) == 1 and trio.current_time() - start == pytest.approx(0.0201)
        n.cancel_scope.cancel()


async def test_an_event_commits_with_its_state_change_or_not_at_all(store):
    hub = EventHub(store)
    sid = new_session(store)
    with hub.transaction(sid) as tx:
        item, turn = store.queue_message(sid, {"type": "message", "role": "user", "content": "hi"})
        tx.publish(ev.INPUT_CONSUMED, item=item, turn_id=turn["id"])
    assert [e["type"] for e in store.read_events(sid, 0)] == [ev.INPUT_CONSUMED]
    with pytest.raises(RuntimeError):
        with hub.transaction(sid) as tx:
            store.finish_turn(turn["id"], "failed", error="boom")
            tx.publish(ev.FAILED, turn_id=turn["id"], error={"code": "x", "message": "boom"})
            raise RuntimeError("the process dies before it commits")
    assert store.get_turn(turn["id"])["status"] == "queued"  # neither the change ...
    assert len(store.read_events(sid, 0)) == 1 and hub.last_seq(sid) == 1  # ... nor its event


async def test_watchers_are_sent_the_text_the_store_wrote_encoded_once(store, monkeypatch, autojump_clock):
    import json

    from omnigent.server import memory_log

    hub = EventHub(store)
    sid = new_session(store)
    dumped: list = []
    real_dumps = json.dumps
    monkeypatch.setattr(memory_log.json, "dumps", lambda obj, **kw: dumped.append(obj) or real_dumps(obj, **kw))
    async with trio.open_nursery() as n:
        n.start_soon(hub.run)
        with hub.transaction(sid) as tx:  # an event of a transaction
            tx.publish(ev.SESSION_STATUS, status="running")
        hub.publish(sid, ev.SESSION_STATUS, status="idle")  # one of its own
        hub.publish(sid, ev.TEXT_DELTA, turn_id="turn_1", delta="d")  # a buffered one
        await trio.sleep(1)
        texts = [memory_log.event_json(e) for e in hub._log(sid).entries]
        n.cancel_scope.cancel()
    stored = store.conn.execute("SELECT data FROM session_events WHERE conversation_id = ? ORDER BY seq",
                                [sid]).fetchall()
    assert texts == [row[0] for row in stored] and len(texts) == 3
    assert [json.loads(t)["sequence_number"] for t in texts] == [1, 2, 3]
    assert len(dumped) == 3  # one encoding per event: the store's (json is one module, counted for both)


async def test_a_held_sessions_followers_read_its_events_once_released_and_no_other_waits(store, autojump_clock):
    hub = EventHub(store)
    held, other = new_session(store), new_session(store)
    seen_held: list = []
    seen_other: list = []
    async with trio.open_nursery() as n:
        n.start_soon(collect, hub, held, None, seen_held)
        n.start_soon(collect, hub, other, None, seen_other)
        await trio.testing.wait_all_tasks_blocked()
        hub.hold(held)  # its turn is being dispatched
        hub.publish(held, ev.INPUT_CONSUMED, item={"id": "msg_1"}, turn_id="turn_1")
        hub.publish(held, ev.SESSION_STATUS, status="running")
        hub.publish(other, ev.SESSION_STATUS, status="running")
        await trio.testing.wait_all_tasks_blocked()
        assert seen_held == [] and [e["status"] for e in seen_other] == ["running"]
        assert hub.last_seq(held) == 2  # logged as ever: only the reading waits
        hub.release(held)  # the runner has the step
        await trio.testing.wait_all_tasks_blocked()
        assert [e["type"] for e in seen_held] == [ev.INPUT_CONSUMED, ev.SESSION_STATUS]
        hub.release(held)  # idempotent
        hub.close()


async def test_a_hold_never_released_lifts_after_hold_max(store, autojump_clock):
    from omnigent.server.hub import HOLD_MAX

    hub = EventHub(store)
    sid = new_session(store)
    got: dict[str, list[float]] = {"early": [], "late": []}

    async def follower(name: str, after: int | None) -> None:
        async for _ in hub.follow(sid, after):
            got[name].append(trio.current_time())

    async with trio.open_nursery() as n:
        n.start_soon(follower, "early", None)
        await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        hub.hold(sid)  # a dispatch that waits (no runner online, say) and never writes a TurnStart
        hub.publish(sid, ev.INPUT_CONSUMED, item={"id": "msg_1"}, turn_id="turn_1")
        await trio.sleep(HOLD_MAX / 2)
        hub.hold(sid)  # a hold in place is kept: its deadline does not move
        n.start_soon(follower, "late", 0)  # one that starts waiting under the second call
        hub.publish(sid, ev.SESSION_STATUS, status="running")
        await trio.sleep(HOLD_MAX)
        assert got == {"early": [start + HOLD_MAX] * 2, "late": [start + HOLD_MAX] * 2}
        hub.publish(sid, ev.SESSION_STATUS, status="idle")  # the lifted hold holds nothing more
        await trio.testing.wait_all_tasks_blocked()
        assert got["early"][-1] == got["late"][-1] == start + HOLD_MAX * 1.5
        hub.close()


async def test_a_post_waits_for_its_sessions_dispatch_at_most_hold_max(store, autojump_clock):
    """`dispatched` (the message route's, before its answer): at once without a hold, until the
    release with one, and no longer than the hold's deadline when nothing releases it."""
    from omnigent.server.hub import HOLD_MAX

    hub = EventHub(store)
    sid = new_session(store)
    start = trio.current_time()
    await hub.dispatched(sid)
    assert trio.current_time() == start  # nothing held: no wait
    hub.hold(sid)
    async with trio.open_nursery() as n:
        n.start_soon(hub.dispatched, sid)
        await trio.sleep(HOLD_MAX / 4)
        hub.release(sid)  # the TurnStart is written
    assert trio.current_time() == start + HOLD_MAX / 4
    hub.hold(sid)  # a dispatch that never writes one
    await hub.dispatched(sid)
    assert trio.current_time() == start + HOLD_MAX * 1.25
    await hub.dispatched(sid)  # lifted: the next post does not wait
    assert trio.current_time() == start + HOLD_MAX * 1.25
    hub.close()


async def test_a_failing_disk_does_not_stop_the_stream(store, monkeypatch):
    hub = EventHub(store)
    sid = new_session(store)
    hub.publish(sid, ev.SESSION_STATUS, status="running")

    def full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(store, "append_events", full)
    event = hub.publish(sid, ev.SESSION_STATUS, status="idle")
    assert event["sequence_number"] == 2  # numbered in memory after the newest stored one
    monkeypatch.undo()
    assert hub.publish(sid, ev.SESSION_STATUS, status="later")["sequence_number"] == 3


def _turn_with_deltas(hub: EventHub, store: Store, sid: str, n: int) -> str:
    item, turn = store.queue_message(sid, {"type": "message", "role": "user", "content": f"q{n}"})
    hub.publish(sid, ev.INPUT_CONSUMED, item=item, turn_id=turn["id"])
    store.start_turn(turn["id"], "runner_x")
    for part in ("a", "b"):
        hub.publish(sid, ev.TEXT_DELTA, turn_id=turn["id"], delta=part)
    with hub.transaction(sid) as tx:
        store.append_turn_output(sid, turn["id"], [{"type": "message", "role": "assistant",
                                                    "content": [{"type": "output_text", "text": "ab"}]}], None)
        store.finish_turn(turn["id"], "completed")
        tx.publish(ev.COMPLETED, turn_id=turn["id"], response={"output": []})
    return turn["id"]


async def test_deltas_of_old_turns_are_compacted_and_an_older_cursor_gets_a_resync(store):
    hub = EventHub(store, delta_turns=2)
    sid = new_session(store)
    turns = [_turn_with_deltas(hub, store, sid, n) for n in range(4)]  # 4 events each: 16 in all
    kept = store.read_events(sid, 0)
    deltas = {e["turn_id"] for e in kept if e["type"] == ev.TEXT_DELTA}
    assert deltas == set(turns[2:])  # the two newest turns keep their deltas
    assert [e["type"] for e in kept].count(ev.COMPLETED) == 4  # item-level events are all kept
    assert store.event_floor(sid) == 7  # the last delta of the second turn
    seen: list[dict] = []
    async with trio.open_nursery() as n:
        n.start_soon(collect, hub, sid, 3, seen)  # inside what was compacted
        n.start_soon(collect, hub, sid, 7, fresh := [])  # at the floor: a plain replay
        await trio.testing.wait_all_tasks_blocked()
        hub.publish(sid, ev.SESSION_STATUS, status="idle")
        await trio.testing.wait_all_tasks_blocked()
        hub.close()
    resync = seen[0]
    assert resync["type"] == ev.RESYNC and resync["reason"] == "compacted" and resync["after"] == 3
    assert resync["sequence_number"] == 16 and resync["session"]["id"] == sid
    assert [t["status"] for t in resync["turns"]] == ["completed"] * 4
    assert [i["role"] for i in resync["items"]] == ["user", "assistant"] * 4
    assert seqs(seen[1:]) == [17]  # then the live tail, nothing twice
    assert seqs(fresh) == list(range(8, 18))
    assert store.read_events(sid, 0, before=100)[-1]["sequence_number"] == 17


def _run_with_deltas(hub: EventHub, store: Store, sid: str, turn_id: str) -> None:
    store.start_turn(turn_id, "runner_x")
    hub.publish(sid, ev.TEXT_DELTA, turn_id=turn_id, delta="d")
    with hub.transaction(sid) as tx:
        store.finish_turn(turn_id, "completed")
        tx.publish(ev.COMPLETED, turn_id=turn_id, response={"output": []})


def _delta_turns(store: Store, sid: str) -> set[str]:
    return {e["turn_id"] for e in store.read_events(sid, 0, limit=10_000) if e["type"] == ev.TEXT_DELTA}


async def test_turns_pushed_out_of_the_window_by_a_queue_are_compacted_too(store):
    """Two turns end inside the window, then 30 queued at once push them 30 turns back: a turn's
    end must look past the window by as many turns as are still open, not by a fixed few."""
    hub = EventHub(store, delta_turns=2)
    sid = new_session(store)
    early = [_turn_with_deltas(hub, store, sid, n) for n in range(2)]
    assert _delta_turns(store, sid) == set(early)
    queued = [store.queue_message(sid, {"type": "message", "role": "user", "content": f"q{n}"})[1]["id"]
              for n in range(30)]
    _run_with_deltas(hub, store, sid, queued[0])
    assert not _delta_turns(store, sid) & set(early)  # gone at the first end after the queue
    for turn_id in queued[1:]:
        _run_with_deltas(hub, store, sid, turn_id)
    assert _delta_turns(store, sid) == set(queued[-2:])
    assert store.compact_events(sid, 2) == 0  # the full pass finds nothing left


async def test_an_old_turn_that_ends_again_is_compacted_at_its_end(store):
    sid = new_session(store)
    turns = [store.queue_message(sid, {"type": "message", "role": "user", "content": "q"})[1]["id"]]
    for n in range(39):
        turns.append(store.create_turn(sid, None)["id"])
    for turn_id in turns:
        store.start_turn(turn_id, "runner_x")
        store.append_events(sid, [{"type": ev.TEXT_DELTA, "turn_id": turn_id, "delta": "d"}])
        store.finish_turn(turn_id, "completed")
    # the oldest turn, far past the window and the sweep, ends (again): its deltas go at once
    store.append_events(sid, [{"type": ev.COMPLETED, "turn_id": turns[0], "response": {}}], keep_turns=2)
    left = _delta_turns(store, sid)
    assert turns[0] not in left and set(turns[-2:]) <= left


async def test_a_turns_end_looks_at_a_bounded_number_of_turns_however_long_the_session(store):
    """O(1) per turn end, not O(turns): the old pass listed every older turn in its IN (...)."""
    hub = EventHub(store, delta_turns=2)
    sid = new_session(store)
    for n in range(60):
        _turn_with_deltas(hub, store, sid, n)
    statements: list[str] = []
    store.conn.set_trace_callback(statements.append)
    try:
        _turn_with_deltas(hub, store, sid, 60)
    finally:
        store.conn.set_trace_callback(None)
    compaction = [sql for sql in statements if "session_events" in sql and ("DELETE" in sql or "MAX(" in sql)]
    # the window (2), the ending turn and 2 to spare past them; the full pass named all 59
    assert compaction and max(sql.count("'turn_") for sql in compaction) <= 2 + 1 + 2
    assert not any("NOT IN" in sql for sql in statements)
    # and by the turns' index: MAX(seq) by the (conversation_id, seq) key read the whole log
    top = next(sql for sql in compaction if "MAX(" in sql and "turn_id IN" in sql)
    plan = " ".join(str(row[-1]) for row in store.conn.execute("EXPLAIN QUERY PLAN " + top))
    assert "idx_session_events_turn" in plan, plan
    assert _delta_turns(store, sid) == {t["id"] for t in store.list_turns(sid)[-2:]}


async def test_a_session_older_than_the_log_starts_at_one_and_cursor_zero_gets_a_resync(tmp_path):
    path = tmp_path / "chat.db"
    shutil.copy(OLD_STORE, path)
    with Store(path) as store:
        sid = store.list_conversations(limit=1)[0]["id"]
        items = store.list_items(sid)
        hub = EventHub(store)
        assert hub.last_seq(sid) == 0 and store.event_floor(sid) == 1
        seen: list[dict] = []
        async with trio.open_nursery() as n:
            n.start_soon(collect, hub, sid, 0, seen)
            await trio.testing.wait_all_tasks_blocked()
            assert hub.publish(sid, ev.SESSION_STATUS, status="idle")["sequence_number"] == 1
            await trio.testing.wait_all_tasks_blocked()
            hub.close()
        assert seen[0]["type"] == ev.RESYNC and seen[0]["reason"] == "before_log"
        assert seen[0]["items"] == items and seen[0]["sequence_number"] == 0
        assert seqs(seen[1:]) == [1]
        new = store.create_conversation(agent_id=None)["id"]  # made after the log: no floor
        assert store.event_floor(new) == 0


async def test_a_cursor_above_the_newest_number_gets_a_resync(store):
    hub = EventHub(store)
    sid = new_session(store)
    hub.publish(sid, ev.SESSION_STATUS, status="idle")
    seen: list[dict] = []
    async with trio.open_nursery() as n:
        n.start_soon(collect, hub, sid, 40, seen)
        await trio.testing.wait_all_tasks_blocked()
        hub.publish(sid, ev.SESSION_STATUS, status="running")
        await trio.testing.wait_all_tasks_blocked()
        hub.close()
    assert [(e["type"], e["sequence_number"]) for e in seen] == [(ev.RESYNC, 1), (ev.SESSION_STATUS, 2)]
    assert seen[0]["reason"] == "ahead"


async def test_a_heartbeat_after_15_s_of_silence_unnumbered_and_never_stored(store, autojump_clock):
    hub = EventHub(store)
    sid = new_session(store)
    seen: list[tuple[float, dict]] = []

    async def watch() -> None:
        async for event in hub.follow(sid, None, heartbeat=15.0):
            seen.append((trio.current_time(), event))

    async with trio.open_nursery() as n:
        n.start_soon(watch)
        await trio.sleep(10)
        hub.publish(sid, ev.SESSION_STATUS, status="running")  # resets the silence
        await trio.sleep(40)
        hub.close()
    times = [(t, e["type"]) for t, e in seen]
    assert times == [(10, ev.SESSION_STATUS), (25, ev.HEARTBEAT), (40, ev.HEARTBEAT)]
    assert all("sequence_number" not in e for _, e in seen[1:])
    assert [e["type"] for e in store.read_events(sid, 0)] == [ev.SESSION_STATUS]


async def test_idle_sessions_memory_logs_are_emptied_past_the_budget_and_read_back_from_the_store(store):
    """Each log is bounded, but a long-running server follows ever more sessions: the memory
    held stays within `kept_events` across them, and nothing is lost to a follower."""
    hub = EventHub(store, capacity=100, kept_events=250)
    sids = [new_session(store) for _ in range(5)]
    for sid in sids:
        for n in range(100):
            hub.publish(sid, ev.SESSION_STATUS, status=f"s{n}")
    held = {sid: len(hub._logs[sid].entries) for sid in sids}
    assert sum(held.values()) <= 250
    assert held[sids[-1]] == 100 and held[sids[0]] == 0  # the least recently published went first
    seen: list[dict] = []
    async with trio.open_nursery() as n:
        n.start_soon(collect, hub, sids[0], 0, seen)
        await trio.testing.wait_all_tasks_blocked()
        hub.close()
    assert seqs(seen) == list(range(1, 101))
    assert [e["status"] for e in seen] == [f"s{k}" for k in range(100)]


async def test_without_a_store_the_memory_logs_are_the_only_copy_and_are_kept():
    hub = EventHub(None, capacity=100, kept_events=150)
    for sid in ("a", "b", "c"):
        for n in range(100):
            hub.publish(sid, ev.SESSION_STATUS, status=f"s{n}")
    assert [len(hub._logs[sid].entries) for sid in ("a", "b", "c")] == [100, 100, 100]
