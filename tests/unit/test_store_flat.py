"""The store's per-turn statements stay flat as a session grows: none walks its history.

A turn's own statements run on every message and dispatch; one that reads a
session's ended turns or its whole event log makes each turn cost O(history)
and a conversation O(n²). These tests read SQLite's query plans, so they
hold on any machine, without timing (the compaction's, with the rows it
names, are in test_event_log.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from omnigent.store import Store


@pytest.fixture
def store(tmp_path: Path):
    with Store(tmp_path / "chat.db") as s:
        yield s


def _plan(store: Store, sql: str) -> str:
    return " | ".join(str(row[-1]) for row in store.conn.execute("EXPLAIN QUERY PLAN " + sql))


def _statements(store: Store, action) -> list[str]:
    seen: list[str] = []
    store.conn.set_trace_callback(seen.append)
    try:
        action()
    finally:
        store.conn.set_trace_callback(None)
    return seen


def _long_session(store: Store, turns: int) -> str:
    sid = store.create_conversation(agent_id=None)["id"]
    for n in range(turns):
        _, turn = store.queue_message(sid, {"type": "message", "role": "user", "content": f"q{n}"})
        store.start_turn(turn["id"], "runner_x")
        store.finish_turn(turn["id"], "completed")
    return sid


def test_a_sessions_open_turns_are_found_by_index_not_by_walking_its_ended_ones(store):
    sid = _long_session(store, 30)
    asked = _statements(store, lambda: (
        store.queue_message(sid, {"type": "message", "role": "user", "content": "next"}),  # busy?
        store.next_own_queued_turn(sid, 1),
        store.next_queued_turn(sid),  # the session's status
    ))
    by_status = [sql for sql in asked if sql.lstrip().startswith("SELECT") and "FROM turns" in sql
                 and ("status IN" in sql or "status = 'queued'" in sql)]
    assert len(by_status) >= 3, asked
    for sql in by_status:
        assert "idx_turns_conversation_status" in _plan(store, sql), sql


def test_a_taken_over_turn_is_found_by_status_not_by_walking_the_sessions_turns(store):
    """`running_own_turn` (a restart's adoption) reads the open turns only, even though ordering by
    (conversation_id, created_at) would let SQLite skip a sort by walking all of them."""
    sid = _long_session(store, 30)
    asked = _statements(store, lambda: store.running_own_turn(sid, 1))
    [sql] = [s for s in asked if "FROM turns" in s and "'running', 'waiting'" in s]
    plan = _plan(store, sql)
    assert "idx_turns_conversation_status" in plan, plan
