"""What one turn costs the store: its write transactions and statements, counted (not timed).

A plain turn (one model step, no tools) on the server pieces with a stored event log,
as a server runs them: the message, its turn, the conversation's claim, the attempt's
start with its first step, and their events (the route's one transaction, when the
session is idle and its runner online: `TurnService.queue_message`), then the answer
with the turn's end, its events, the text the runner streamed and the claim's release.
Each of these is one write transaction; nothing else writes. The counts are read with
`sqlite3`'s trace callback on the store's connection.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
import trio

from protocol import events as ev
from omnigent.server.hub import EventHub
from omnigent.store import Store
from tests.support.fake_runners import Harness, answers, open_harness

TIMEOUT = 60  # virtual seconds


async def _turn(h: Harness, sid: str, text: str) -> dict[str, Any]:
    """What `POST /v1/sessions/<id>/events` with a message does (server/conversation.py), then its end."""
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    _item, turn = h.turns.queue_message(sid, user)
    h.turns.submit(sid)
    await h.until_terminal(sid, turn["id"])
    await h.settle()  # the worker has left the turn (and its claim) and waits for the next
    return turn


async def _traced_turn(h: Harness, sid: str, text: str) -> tuple[dict[str, Any], list[str]]:
    """`_turn`, with the SQL statements the store ran meanwhile (sqlite3's trace callback)."""
    statements: list[str] = []
    h.store.conn.set_trace_callback(statements.append)
    try:
        turn = await _turn(h, sid, text)
    finally:
        h.store.conn.set_trace_callback(None)
    return turn, statements


async def test_a_turn_makes_two_write_transactions(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [answers("Hello!", after=0.5)], stored_events=True) as h:
            await h.online(1)
            sid = h.new_session()
            await _turn(h, sid, "hi")  # the first binds the session to its runner
            turn, statements = await _traced_turn(h, sid, "again")
            own = [s for s in statements if not s.startswith("--")]  # not the FTS triggers' own
            writes = [s for s in own if s.startswith("BEGIN")]
            assert writes == ["BEGIN IMMEDIATE"] * 2, own
            # the rows a turn has are passed on, not read again (no claim read-back, the session's row
            # read once for the attempt's start, the ended turn's row not read back: its usage only; a turn
            # started with its message reads neither its claim nor its pending message again, nor the
            # step it began and the items it has none of: `LoopTurn.begun`; the step begun and finished
            # without a read of the session first, the answer's step finished in one update of a step
            # under way, and the turn's first usage set without reading the none it had; the message's busy
            # check and its position in one read)
            assert len(own) <= 45, own
            # a savepoint only around a write of several statements (the message, the first step, the
            # answer): one statement joins the open transaction as it is (`_write_one`)
            assert sum(s.startswith("SAVEPOINT") for s in own) == 3, own
            row = h.store.get_turn(turn["id"])
            assert row["status"] == "completed" and row["step"]["status"] == "completed"
            assert h.store.claim_of(sid) is None  # released with the turn's end
            types = [e["type"] for e in h.store.read_events(sid, 0)]
            assert types[-7:] == [ev.INPUT_CONSUMED, ev.SESSION_STATUS, ev.RESPONSE_CREATED, ev.TEXT_DELTA,
                                  ev.USAGE, ev.COMPLETED, ev.SESSION_STATUS]


async def test_a_turn_end_that_rolls_back_after_releasing_the_claim_still_releases_it(autojump_clock, tmp_path):
    """`release_with_end` deletes the claim inside the turn's last transaction; when that transaction
    fails after it (rolled back: the claim is there again), the claim must still be released, or
    every other process waits out its lease."""
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [answers("Hello!", after=0.5)], stored_events=True) as h:
            await h.online(1)
            sid = h.new_session()
            loop = h.turns.loop
            release, append = loop._release_claim, h.store.append_events
            assert release is not None

            def released_then_failing(session_id: str) -> None:
                release(session_id)

                def failing(*args: Any, **kwargs: Any) -> list[str]:
                    h.store.append_events = append  # once
                    raise sqlite3.OperationalError("disk I/O error")

                h.store.append_events = failing  # the end's events, stored after the release

            loop._release_claim = released_then_failing
            turn = await _turn(h, sid, "hi")
            assert h.store.get_turn(turn["id"])["status"] == "failed"  # the end was not stored
            assert h.store.claim_of(sid) is None


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "chat.db") as s:
        yield s


async def test_buffered_events_join_the_next_transaction_or_go_alone_when_it_fails(store, autojump_clock):
    hub = EventHub(store, batch_interval=0.02)
    sid = store.create_conversation(agent_id=None)["id"]
    seen: list[dict[str, Any]] = []

    async def follow() -> None:
        async for event in hub.follow(sid, 0):
            seen.append(event)

    async with trio.open_nursery() as n:
        await n.start(hub.run)
        n.start_soon(follow)
        statements: list[str] = []
        store.conn.set_trace_callback(statements.append)
        hub.publish(sid, ev.TEXT_DELTA, turn_id="turn_1", delta="a")
        hub.publish_soon(sid, ev.ITEM_DONE, turn_id="turn_1", item={"type": "message"})
        with hub.transaction(sid) as tx:
            tx.publish(ev.SESSION_STATUS, status="idle")
        assert statements.count("BEGIN IMMEDIATE") == 1  # the buffered two went with it
        hub.publish(sid, ev.TEXT_DELTA, turn_id="turn_1", delta="b")
        with pytest.raises(RuntimeError):
            with hub.transaction(sid) as tx:
                tx.publish(ev.SESSION_STATUS, status="lost")
                raise RuntimeError("the block fails before it commits")
        store.conn.set_trace_callback(None)
        await trio.testing.wait_all_tasks_blocked()
        n.cancel_scope.cancel()
    expected = [(ev.TEXT_DELTA, 1), (ev.ITEM_DONE, 2), (ev.SESSION_STATUS, 3), (ev.TEXT_DELTA, 4)]
    assert [(e["type"], e["sequence_number"]) for e in seen] == expected  # the delta was not lost
    assert [(e["type"], e["sequence_number"]) for e in store.read_events(sid, 0)] == expected


async def test_a_queued_turn_placed_on_its_bound_runner_reads_the_session_once(autojump_clock, tmp_path):
    """A turn queued behind another is placed by its worker: placement reads the session's row to
    find its bound runner, and the attempt goes on with that row instead of reading it again."""
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [answers("Hello!", after=0.5)], stored_events=True) as h:
            await h.online(1)
            sid = h.new_session()
            await _turn(h, sid, "hi")  # binds the session to its runner
            first = h.post(sid, "one")  # started with its message
            second = h.post(sid, "two")  # queued behind it: its worker places it
            assert second["status"] == "queued"
            statements: list[str] = []
            h.store.conn.set_trace_callback(statements.append)
            try:
                await h.until_terminal(sid, first["id"])
                await h.until_terminal(sid, second["id"])
            finally:
                h.store.conn.set_trace_callback(None)
            assert h.store.get_turn(second["id"])["status"] == "completed"
            rows = [s for s in statements if s.split()[:3] == ["SELECT", "c.id,", "c.kind,"]]  # get_conversation
            assert len(rows) == 1, rows


async def test_a_turns_watchers_get_its_end_before_its_worker_reads_the_queue_again(autojump_clock, tmp_path):
    """The worker's look for a next queued turn (a store read) waits until the watchers woken by
    the turn's end have run: their `response.completed` is not written behind it. trio runs a
    batch of woken tasks in either order, so a dozen turns would catch a worker that went first."""
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [answers("Hello!", after=0.5)], stored_events=True) as h:
            await h.online(1)
            sid = h.new_session()
            await _turn(h, sid, "hi")  # the first binds the session to its runner (its worker reads first)
            order: list[str] = []
            read_queue = h.store.next_own_queued_turn

            def recorded(*args: Any, **kwargs: Any) -> Any:
                order.append("read")
                return read_queue(*args, **kwargs)

            h.store.next_own_queued_turn = recorded  # type: ignore[method-assign]

            async def watch() -> None:
                async for event in h.hub.follow(sid):
                    if event["type"] == ev.COMPLETED:
                        order.append("end")

            h.nursery.start_soon(watch)
            for n in range(12):
                await _turn(h, sid, f"turn {n}")
            assert order == ["end", "read"] * 12


async def test_a_new_sessions_first_turn_binds_its_runner_in_its_messages_transaction(autojump_clock, tmp_path):
    """A first message finds no runner bound: the least loaded online one is bound in the message's
    transaction (`Placement.at_once`, compare-and-set as ever), and the attempt starts there too, so
    the first turn is two write transactions as every later one, not four."""
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [answers("Hello!", after=0.5)], stored_events=True) as h:
            [runner_id] = await h.online(1)
            sid = h.new_session()
            turn, statements = await _traced_turn(h, sid, "hi")
            writes = [s for s in statements if s.startswith("BEGIN")]
            assert writes == ["BEGIN IMMEDIATE"] * 2, statements
            conv = h.store.get_conversation(sid)
            assert conv["runner_id"] == runner_id and conv["generation"] == 1
            row = h.store.get_turn(turn["id"])
            assert row["status"] == "completed" and row["attempt"] == 1 and row["generation"] == 1
            types = [e["type"] for e in h.store.read_events(sid, 0)]
            assert types[:3] == [ev.INPUT_CONSUMED, ev.SESSION_STATUS, ev.RESPONSE_CREATED]
