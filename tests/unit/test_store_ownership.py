"""Migration 0006_ownership in the store: generations, turns taken over after a restart, pinned specs."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from omnigent.store import Store
from omnigent.store.owners import ClaimOwner

OLD_STORE = Path(__file__).parents[1] / "resources" / "stores" / "chat-0.1.0.db"


@pytest.fixture
def store(tmp_path: Path):
    with Store(tmp_path / "chat.db") as s:
        yield s


@pytest.fixture
def conv(store: Store) -> dict:
    agent = store.upsert_agent("helper", {"name": "helper", "model": "m"})
    return store.create_conversation(agent_id=agent["id"])


def test_every_change_of_binding_bumps_the_generation(store: Store, conv: dict):
    cid = conv["id"]
    assert conv["generation"] == 0
    store.set_runner(cid, "runner_a")
    store.set_runner(cid, "runner_a")  # the same runner again: no change
    assert store.get_conversation(cid)["generation"] == 1
    assert not store.bind_runner(cid, "runner_b", expected="runner_x")  # a failed compare-and-set
    assert store.bind_runner(cid, "runner_b", expected="runner_a")
    assert store.rebind_runner("runner_b", "runner_c") == [cid]
    store.set_runner(cid, None)
    assert store.get_conversation(cid)["generation"] == 4


def test_a_turn_attempt_records_its_generation(store: Store, conv: dict):
    turn = store.create_turn(conv["id"], None)
    assert store.start_turn(turn["id"], "runner_a", generation=3)["generation"] == 3


def test_take_over_takes_a_dead_owners_turns_and_leaves_a_live_ones(store: Store, conv: dict):
    other = store.create_conversation(agent_id=conv["agent_id"])
    running = store.start_turn(store.create_turn(conv["id"], None, owner_pid=111)["id"], "r", 111)
    queued = store.create_turn(other["id"], None, owner_pid=111)
    live = store.start_turn(store.create_turn(other["id"], None, owner_pid=222)["id"], "r", 222)
    # a turn between attempts when its process died: interrupted, and its conversation claim names it
    third = store.create_conversation(agent_id=conv["agent_id"])
    waiting = store.start_turn(store.create_turn(third["id"], None, owner_pid=111)["id"], "r", 111)
    store.finish_turn(waiting["id"], "interrupted", error="runner r was lost")
    assert store.claim_conversation(third["id"], ClaimOwner(111, "x"), turn_id=waiting["id"], lease=6)
    # an interrupted turn no claim names (a crash of an older release, say) is left alone
    old = store.create_conversation(agent_id=conv["agent_id"])
    left = store.create_turn(old["id"], None, owner_pid=111)
    store.finish_turn(left["id"], "interrupted")
    taken = store.take_over_orphaned_turns(lambda pid: pid == 222, owner_pid=999)
    assert {t["id"]: t["status"] for t in taken} == {
        running["id"]: "running", queued["id"]: "queued", waiting["id"]: "queued"}
    assert all(t["owner_pid"] == 999 for t in taken)
    assert store.get_turn(live["id"])["owner_pid"] == 222
    assert store.get_turn(left["id"])["status"] == "interrupted"
    assert store.running_own_turn(conv["id"], 999)["id"] == running["id"]


def test_a_session_runs_its_pinned_spec_whatever_is_uploaded_later(store: Store, conv: dict):
    assert store.session_spec(conv["id"]) == {"name": "helper", "model": "m"}
    store.upsert_agent("helper", {"name": "helper", "model": "other"})
    assert store.session_spec(conv["id"])["model"] == "m"
    store.pin_session_agent(conv["id"], {"name": "helper", "model": "resumed"})
    assert store.session_spec(conv["id"])["model"] == "resumed"


def test_the_old_store_upgrades_with_every_session_pinned(tmp_path: Path):
    path = tmp_path / "chat.db"
    shutil.copy(OLD_STORE, path)
    with Store(path) as store:
        convs = store.list_conversations(limit=None, kind=None)
        assert len(convs) == 100
        for conv in convs[:10]:
            assert conv["generation"] == 0
            named = store.get_agent(conv["agent_id"])["spec"]
            assert store.session_spec(conv["id"]) == named
        assert store.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    # a session an older process creates after the upgrade has no pinned row: it reads the named one
    with sqlite3.connect(path) as db:
        agent_id = db.execute("SELECT agent_id FROM conversations LIMIT 1").fetchone()[0]
        db.execute("INSERT INTO conversations (id, kind, created_at, updated_at, title, agent_id)"
                   " VALUES ('conv_legacy', 1, 1, 1, '', ?)", [agent_id])
    with Store(path) as store:
        assert store.session_spec("conv_legacy") == store.get_agent(agent_id)["spec"]
