"""The server indexes queued messages in batches, every INDEX_EVERY s, while its hub runs (MockClock)."""

from __future__ import annotations

import sqlite3

import trio

from omnigent.server import search_indexing
from omnigent.server.hub import EventHub
from omnigent.store import Store


def _user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _indexed(store: Store) -> int:
    return store.conn.execute("SELECT COUNT(*) FROM search_text").fetchone()[0]


async def test_the_hub_indexes_what_was_queued_every_round(autojump_clock, tmp_path):
    store = Store(tmp_path / "chat.db")
    conv = store.create_conversation(agent_id=None)["id"]
    hub = EventHub(store)
    async with trio.open_nursery() as nursery:
        await nursery.start(hub.run)
        store.append_item(conv, _user("one"))
        store.append_item(conv, _user("two"))
        await trio.sleep(search_indexing.INDEX_EVERY - 0.1)
        assert _indexed(store) == 0  # one batch a round, not a write a message
        await trio.sleep(0.2)
        assert _indexed(store) == 2
        store.append_item(conv, _user("three"))
        await trio.sleep(search_indexing.INDEX_EVERY)
        assert _indexed(store) == 3
        nursery.cancel_scope.cancel()
    store.close()


async def test_a_failed_round_is_tried_again_and_loses_nothing(autojump_clock, tmp_path, monkeypatch):
    store = Store(tmp_path / "chat.db")
    conv = store.create_conversation(agent_id=None)["id"]
    store.append_item(conv, _user("waits"))
    real = store.index_pending_messages
    calls: list[float] = []

    def failing_once() -> int:
        calls.append(trio.current_time())
        if len(calls) == 1:
            raise sqlite3.OperationalError("database or disk is full")
        return real()

    monkeypatch.setattr(store, "index_pending_messages", failing_once)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(search_indexing.index_in_batches, store, 1.0)
        await trio.sleep(2.5)
        nursery.cancel_scope.cancel()
    assert calls == [1.0, 2.0] and _indexed(store) == 1
    store.close()
