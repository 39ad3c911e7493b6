"""Store side of one turn at a time per conversation: claims, pending messages, own turns, upgrade."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from omnigent.store import NotFoundError, Store
from omnigent.store.db import applied_migrations
from omnigent.store.owners import ClaimOwner, owner_alive, process_started

OLD_STORE = Path(__file__).resolve().parents[1] / "resources" / "stores" / "chat-0.1.0.db"


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": text}


def test_a_claim_is_exclusive_renewable_and_released_by_its_owner_only(tmp_path):
    now = [1000.0]
    store = Store(tmp_path / "chat.db", clock=lambda: now[0])
    conv = store.create_conversation(agent_id=None)["id"]
    me, other = ClaimOwner.this_process(), ClaimOwner(os.getpid(), ClaimOwner.this_process().started, "other")
    assert store.claim_conversation(conv, me, turn_id="turn_a", lease=6)
    assert store.claim_conversation(conv, me, turn_id="turn_a", lease=6)  # re-entrant for its owner
    assert not store.claim_conversation(conv, other, turn_id="turn_b", lease=6)
    assert store.claimed_elsewhere(conv, other) and not store.claimed_elsewhere(conv, me)
    now[0] += 5
    assert store.renew_claims([conv], me, lease=6) == {conv} and not store.renew_claims([conv], other, lease=6)
    now[0] += 5  # within the renewed lease
    assert not store.claim_conversation(conv, other, turn_id="turn_b", lease=6)
    now[0] += 2  # lease ran out: taken over
    assert store.claim_conversation(conv, other, turn_id="turn_b", lease=6)
    assert not store.renew_claims([conv], me, lease=6) and not store.release_claim(conv, me)
    assert store.release_claim(conv, other) and store.claim_of(conv) is None


def test_renewals_and_cancel_requests_take_more_ids_than_sqlite_binds_in_one_statement(tmp_path):
    """A process may hold more claims than SQLite binds in one statement: the ids go in chunks.

    SQLite's limit is a build setting (32,766 by default, 250,000 in Debian's build, 999 before
    3.32): the test lowers it to 999, so it means the same on every build."""
    store = Store(tmp_path / "chat.db")
    store.conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
    conv = store.create_conversation(agent_id=None)["id"]
    me = ClaimOwner.this_process()
    turn = store.create_turn(conv, None)["id"]
    assert store.claim_conversation(conv, me, turn_id=turn, lease=6) and store.request_cancel(conv) == 1
    unknown = [f"x{i}" for i in range(2_000)]
    assert store.renew_claims([*unknown, conv], me, lease=6) == {conv}
    assert store.cancel_requested([*unknown, turn]) == {turn}


def test_a_message_is_appended_from_the_one_read_of_its_conversation(tmp_path):
    """`queue_message` reads the conversation once: whether it exists, whether it is busy, and where
    the message goes (its position, whether it has a title, the newest `updated_at`)."""
    now = [1000.0]
    store = Store(tmp_path / "chat.db", clock=lambda: now[0])
    with pytest.raises(NotFoundError):
        store.queue_message("conv_missing", user("lost"))
    assert store.conn.execute("SELECT COUNT(*) FROM turns").fetchone()[0] == 0
    conv = store.create_conversation(agent_id=None)["id"]
    later = store.create_conversation(agent_id=None)["id"]
    store.conn.execute("UPDATE conversations SET updated_at = 2000.0 WHERE id = ?", [later])
    store.conn.commit()
    statements: list[str] = []
    store.conn.set_trace_callback(statements.append)
    try:
        first, turn = store.queue_message(conv, user("deploy the site"))
    finally:
        store.conn.set_trace_callback(None)
    reads = [s for s in statements if not s.startswith("--") and "FROM conversations WHERE id" in s]
    assert len(reads) == 1, reads  # one statement reads the conversation's row
    assert store.get_conversation(conv)["title"] == "deploy the site"  # the untitled one takes its first
    assert store.get_conversation(conv)["updated_at"] > 2000.0  # after every other's, clock or not
    store.end_turn(turn["id"], "completed")
    second, _ = store.queue_message(conv, user("and again"))
    assert [i["id"] for i in store.list_items(conv)] == [first["id"], second["id"]]
    assert store.get_conversation(conv)["title"] == "deploy the site"


def test_a_message_to_an_idle_conversation_takes_the_claim_for_its_turn(tmp_path):
    """`queue_message(claim=...)`: the claim for the new turn commits with the message, so the
    turn service that runs it only reads it (`holds_claim`); a busy conversation's claim, or
    another process's, is left as it is."""
    now = [1000.0]
    store = Store(tmp_path / "chat.db", clock=lambda: now[0])
    conv = store.create_conversation(agent_id=None)["id"]
    me, other = ClaimOwner.this_process(), ClaimOwner(os.getpid(), ClaimOwner.this_process().started, "other")
    _, turn = store.queue_message(conv, user("one"), claim=me, lease=6)
    claim = store.claim_of(conv)
    assert (claim["turn_id"], claim["owner_token"], claim["lease_until"], claim["live"]) == \
        (turn["id"], me.token, 1006.0, True)
    assert store.holds_claim(conv, me, turn_id=turn["id"], for_at_least=4)
    assert not store.holds_claim(conv, me, turn_id="turn_other")
    assert not store.holds_claim(conv, other)
    assert not store.claim_conversation(conv, other, turn_id=None, lease=6)  # it is a real claim
    now[0] += 2.5
    assert not store.holds_claim(conv, me, turn_id=turn["id"], for_at_least=4)  # too little left
    assert store.holds_claim(conv, me, turn_id=turn["id"])
    _, pending = store.queue_message(conv, user("two"), claim=other, lease=6)  # busy: waits
    assert store.claim_of(conv)["turn_id"] == turn["id"] and store.claim_of(conv)["owner_token"] == me.token
    assert pending["status"] == "queued"
    store.release_claim(conv, me)
    other_conv = store.create_conversation(agent_id=None)["id"]
    store.queue_message(other_conv, user("no claim asked"))
    assert store.claim_of(other_conv) is None


def test_a_dead_or_reused_pid_does_not_hold_a_claim(tmp_path):
    store = Store(tmp_path / "chat.db")
    me = ClaimOwner.this_process()
    assert me.started and process_started(os.getpid()) == me.started
    assert owner_alive(me.pid, me.started)
    assert not owner_alive(me.pid, str(int(me.started) + 1))  # same pid, another process
    assert not owner_alive(4_194_304 + 99, "5")
    conv = store.create_conversation(agent_id=None)["id"]
    assert store.claim_conversation(conv, ClaimOwner(me.pid, str(int(me.started) + 1), "x"), turn_id=None, lease=60)
    assert not store.claim_of(conv)["live"]
    assert store.claim_conversation(conv, me, turn_id=None, lease=60)


def test_a_message_to_a_busy_conversation_waits_and_joins_after_the_answer(tmp_path):
    store = Store(tmp_path / "chat.db")
    conv = store.create_conversation(agent_id=None)["id"]
    first, turn1 = store.queue_message(conv, user("one"))
    assert [i["id"] for i in store.list_items(conv)] == [first["id"]]  # idle: stored at once
    second, turn2 = store.queue_message(conv, user("two"))               # busy: pending
    assert [i["id"] for i in store.list_items(conv)] == [first["id"]]
    assert turn2["input_item_id"] == second["id"] and turn2["status"] == "queued"
    store.start_turn(turn1["id"], "runner_x")
    store.append_turn_output(conv, turn1["id"], [{"type": "message", "role": "assistant", "content": "1"}], None)
    store.finish_turn(turn1["id"], "completed")
    assert store.place_pending(conv, second["id"])["id"] == second["id"]
    assert store.place_pending(conv, second["id"]) is None  # once
    assert [i["role"] for i in store.list_items(conv)] == ["user", "assistant", "user"]
    assert store.list_items(conv)[-1]["content"] == "two"


def test_each_process_takes_only_its_own_queued_turns(tmp_path):
    store = Store(tmp_path / "chat.db")
    conv = store.create_conversation(agent_id=None)["id"]
    theirs = store.create_turn(conv, None, owner_pid=os.getpid() + 1)
    mine = store.create_turn(conv, None)
    assert store.next_queued_turn(conv)["id"] == theirs["id"]
    assert store.next_own_queued_turn(conv, os.getpid())["id"] == mine["id"]


def test_runner_loads_count_bound_conversations(tmp_path):
    store = Store(tmp_path / "chat.db")
    for runner in ("a", "a", "b"):
        store.set_runner(store.create_conversation(agent_id=None)["id"], f"runner_{runner}")
    assert store.runner_loads(["runner_a", "runner_b", "runner_c"]) == {"runner_a": 2, "runner_b": 1, "runner_c": 0}


def test_a_store_of_release_0_1_0_upgrades_and_takes_messages(tmp_path):
    path = tmp_path / "chat.db"
    shutil.copy(OLD_STORE, path)
    with Store(path) as store:
        applied = applied_migrations(store.db)
        assert "0003_conversation_claims" in applied
        conv = store.list_conversations(limit=1)[0]["id"]
        before = store.count_items(conv)
        item, turn = store.queue_message(conv, user("after the upgrade"))
        assert store.count_items(conv) == before + 1 and turn["status"] == "queued"
        assert store.conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
