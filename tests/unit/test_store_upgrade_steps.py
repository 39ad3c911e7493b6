"""Migrations 0007 and 0008 on a store of the previous schema holding 10,000 items.

0008 rebuilds `turns` and `conversation_items` (new CHECK constraints), so
this checks what a rebuild could lose: every row of both tables with every
column and its rowid, the rows of every other table (no ON DELETE CASCADE
fired by the DROPs), every index, the schema as a fresh store has it, and
that the conversations go on (a new turn with steps, a retry) afterwards.
The store is built here at `MIGRATIONS[:6]`, exactly the previous schema,
with raw SQL in the shapes the previous release wrote.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from omnigent.store import MIGRATIONS, Store, StoreError
from omnigent.store import db as store_db
from omnigent.store.migrations import Migration

ITEMS = 10_000
CONVERSATIONS = 100
ITEM_STATUSES = ("completed", "in_progress", "incomplete", "failed")
TURN_STATUSES = ("queued", "running", "completed", "failed", "interrupted", "cancelled")
PREVIOUS = MIGRATIONS[:6]


def build_previous_store(path: Path, items: int = ITEMS) -> None:
    """A store at the schema of MIGRATIONS[:6], filled as the previous release would have."""
    assert PREVIOUS[-1].name == "0006_ownership"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA foreign_keys = ON")
    with conn:
        conn.executescript("""CREATE TABLE migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL);
                              CREATE TABLE additive_migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL);""")
        for migration in PREVIOUS:
            for statement in migration.sql.split(";\n"):
                if statement.strip():
                    conn.execute(statement)
            table = "additive_migrations" if migration.additive else "migrations"
            conn.execute(f"INSERT INTO {table} VALUES (?, 1.0)", [migration.name])
        now = 1_780_000_000.0
        conn.execute("INSERT INTO agents (id, name, spec, created_at, updated_at) VALUES ('ag_1', 'old', '{}', ?, ?)",
                     [now, now])
        per_conv = items // CONVERSATIONS
        item_rows, turn_rows, outputs = [], [], []
        for c in range(CONVERSATIONS):
            cid = f"conv_{c:032x}"
            conn.execute("""INSERT INTO conversations (id, created_at, updated_at, title, agent_id, workspace,
                                next_position, generation) VALUES (?, ?, ?, ?, 'ag_1', '/w', ?, ?)""",
                         [cid, now + c, now + c, f"old {c}", per_conv, c % 3])
            for p in range(0, per_conv, 2):
                turn_id = f"turn_{c:016x}{p:016x}"
                status = TURN_STATUSES[(c + p // 2) % len(TURN_STATUSES)]
                # equal created_at for pairs of turns: their order is the rowid's
                turn_rows.append((turn_id, cid, f"msg_{c:016x}{p:016x}", status, 1, "runner_x", 1,
                                  "boom" if status == "failed" else None, now + p // 4, now, now, c % 3))
                item_rows.append((f"msg_{c:016x}{p:016x}", cid, None, None, None, p, "message", "completed", "user",
                                  json.dumps({"type": "message", "role": "user", "content": f"q {c}.{p}"}), now + p))
                item_rows.append((f"msg_{c:016x}{p + 1:016x}", cid, turn_id, f"resp_{c}_{p}", 0, p + 1, "message",
                                  ITEM_STATUSES[(p // 2) % 4], "assistant",
                                  json.dumps({"type": "message", "role": "assistant", "content": f"a {c}.{p}"}),
                                  now + p + 1))
                outputs.append((turn_id, cid, f"resp_{c}_{p}", 1, now))
        conn.executemany("""INSERT INTO turns (id, conversation_id, input_item_id, status, attempt, runner_id,
                                owner_pid, error, created_at, started_at, ended_at, generation)
                            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""", turn_rows)
        conn.executemany("""INSERT INTO conversation_items (id, conversation_id, turn_id, response_id, output_index,
                                position, type, status, role, data, created_at)
                            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""", item_rows)
        conn.executemany("INSERT INTO turn_outputs VALUES (?, ?, ?, ?, ?)", outputs)
        cid = "conv_" + "0" * 32
        conn.execute("INSERT INTO files (id, conversation_id, filename, bytes, data, created_at) "
                     "VALUES ('file_1', ?, 'a.txt', 1, x'61', ?)", [cid, now])
        conn.execute("INSERT INTO pending_items VALUES (?, 'msg_pending', '{}', ?)", [cid, now])
        conn.execute("INSERT INTO conversation_claims VALUES (?, NULL, 1, 'x', 'tok', ?, ?)", [cid, now, now])
        conn.execute("INSERT INTO session_events VALUES (?, 1, 'x', '{}', ?, NULL)", [cid, now])
        conn.execute("INSERT INTO session_agents VALUES (?, '{}', NULL, ?)", [cid, now])
        conn.execute("INSERT INTO runner_credentials VALUES ('runner_x', 'h', 'host', NULL, ?, NULL)", [now])
    conn.close()


def dump(path: Path) -> dict[str, list[tuple]]:
    """Every row of every table (rowids of the rebuilt ones included), and every index's definition."""
    conn = sqlite3.connect(path)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                             "AND name NOT LIKE '%migrations' ORDER BY name")]
        out = {}
        for table in tables:
            rowid = "rowid, " if table in ("turns", "conversation_items") else ""
            order = "1, 2" if rowid or len(conn.execute(f"PRAGMA table_info({table})").fetchall()) > 1 else "1"
            out[table] = conn.execute(f"SELECT {rowid}* FROM {table} ORDER BY {order}").fetchall()
        out["indexes"] = conn.execute("SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'index' "
                                      "AND sql IS NOT NULL ORDER BY name").fetchall()
        return out
    finally:
        conn.close()


def schema(path: Path) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name").fetchall()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def previous(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("previous") / "chat.db"
    build_previous_store(path)
    return path


@pytest.fixture
def upgraded(previous: Path, tmp_path: Path) -> tuple[dict, Path]:
    path = tmp_path / "chat.db"
    path.write_bytes(previous.read_bytes())
    before = dump(path)
    with Store(path):
        pass
    return before, path


def test_every_row_and_index_is_kept(upgraded):
    before, path = upgraded
    after = dump(path)
    assert len(before["conversation_items"]) == ITEMS
    for table, rows in before.items():
        if table == "turns":  # columns more (0007: two; 0011: cancel_requested_at), NULL on every old turn
            assert [row[:len(rows[0])] for row in after[table]] == rows
            assert {row[len(rows[0]):] for row in after[table]} == {(None, None, None)}
        elif table == "conversations":  # columns more: permission_mode (0007), forked_from/_at_item (0009)
            assert [row[:len(rows[0])] for row in after[table]] == rows
            assert {row[len(rows[0]):] for row in after[table]} == {(None, None, None)}
        elif table == "indexes":  # each recreated exactly; 0007's two and 0012's are new
            new_indexes = {"idx_turn_steps_conversation", "idx_approvals_conversation",
                           "idx_turns_conversation_status"}
            assert [i for i in after[table] if i[0] not in new_indexes] == rows
            assert {i[0] for i in after[table]} - {i[0] for i in rows} == new_indexes
        else:
            assert after[table] == rows, table
    for new in ("turn_steps", "approvals", "approval_rules"):
        assert after[new] == []
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        names = {r[0] for r in conn.execute("SELECT name FROM additive_migrations")}
        assert {"0007_agent_steps", "0008_item_and_turn_statuses"} <= names
        assert not {r[0] for r in conn.execute("SELECT name FROM migrations")} & names
    finally:
        conn.close()


def test_the_upgraded_schema_is_a_fresh_stores(upgraded, tmp_path: Path):
    _, path = upgraded
    fresh = tmp_path / "fresh.db"
    Store(fresh).close()
    assert schema(path) == schema(fresh)


def test_statuses_keep_their_meaning_and_conversations_go_on(upgraded):
    _, path = upgraded
    with Store(path) as store:
        cid = f"conv_{7:032x}"
        turns = store.list_turns(cid)
        assert len(turns) == ITEMS // CONVERSATIONS // 2
        assert {t["status"] for t in turns} == set(TURN_STATUSES)
        assert all(t["step"] is None and t["usage"] is None for t in turns)
        # same order as before: created_at, then rowid
        assert [t["id"] for t in turns] == sorted(t["id"] for t in turns)
        assert {i["status"] for i in store.list_items(cid)} == set(ITEM_STATUSES)
        # the new statuses are accepted now
        with store._write():
            store.conn.execute("UPDATE conversation_items SET status = 'not_run' WHERE conversation_id = ? "
                               "AND position = 1", [cid])
            store.conn.execute("UPDATE turns SET status = 'waiting' WHERE id = ?", [turns[0]["id"]])
        # an old interrupted turn is retried as itself; a new message runs with steps
        interrupted = next(t for t in turns[1:] if t["status"] == "interrupted")
        assert store.requeue_turn(interrupted["id"])["status"] == "queued"
        store.finish_turn(interrupted["id"], "cancelled")
        _, turn = store.queue_message(cid, {"type": "message", "role": "user", "content": "new"})
        store.start_turn(turn["id"], "runner_y")
        store.begin_step(cid, turn["id"], 0, "model", attempt=1)
        assert store.finish_model_step(cid, turn["id"], 0, [{"type": "message", "role": "assistant",
                                                             "content": "ok"}], None, {"total_tokens": 3})
        assert store.get_turn(turn["id"])["step"]["status"] == "completed"
        # the new message waits behind the old queued turns (pending_items); the answer is stored
        assert store.count_items(cid) == ITEMS // CONVERSATIONS + 1


def test_nothing_references_the_rebuilt_tables(tmp_path: Path):
    """A foreign key naming `turns` or `conversation_items` would cascade on 0008's DROP: none may."""
    with Store(tmp_path / "chat.db") as store:
        tables = [r[0] for r in store.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        parents = {row[2] for t in tables for row in store.conn.execute(f"PRAGMA foreign_key_list({t})")}
    assert not parents & {"turns", "conversation_items"}
    assert parents == {"agents", "conversations"}


def test_a_failed_check_rolls_the_migrations_back(previous: Path, tmp_path: Path, monkeypatch):
    path = tmp_path / "chat.db"
    path.write_bytes(previous.read_bytes())
    before = dump(path)
    bad = Migration("9999_bad", "CREATE TABLE doomed (x);", additive=True, check="SELECT 1")
    monkeypatch.setattr(store_db, "MIGRATIONS", (*MIGRATIONS, bad))
    monkeypatch.setattr(store_db, "_KNOWN", store_db._KNOWN | {bad.name})
    monkeypatch.setattr(store_db, "_ADDITIVE", store_db._ADDITIVE | {bad.name})
    with pytest.raises(StoreError, match="9999_bad failed its check"):
        Store(path)
    assert dump(path) == before  # 0007 and 0008 rolled back with it
    assert "approvals" not in {r[1] for r in schema(path)}


def test_old_code_reads_and_writes_an_upgraded_file(upgraded):
    """What release 0.1.0's SQL does on the rebuilt tables (the e2e test runs its real code)."""
    _, path = upgraded
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        cid = f"conv_{3:032x}"
        with conn:
            conn.execute("""INSERT INTO turns (id, conversation_id, input_item_id, status, owner_pid, created_at)
                            VALUES ('turn_old', ?, NULL, 'queued', ?, 1.0)""", [cid, os.getpid()])
            conn.execute("""INSERT INTO conversation_items (id, conversation_id, position, type, status, data,
                            created_at) VALUES ('msg_old', ?, 100000, 'message', 'completed', '{}', 1.0)""", [cid])
        with pytest.raises(sqlite3.IntegrityError):  # the CHECK constraints are still there
            conn.execute("UPDATE turns SET status = 'bogus' WHERE id = 'turn_old'")
        with pytest.raises(sqlite3.IntegrityError):  # and so is the partial unique index
            conn.execute("""INSERT INTO conversation_items (id, conversation_id, turn_id, output_index, position,
                            type, data, created_at) SELECT 'msg_dup', conversation_id, turn_id, output_index, 200000,
                            type, data, created_at FROM conversation_items WHERE turn_id IS NOT NULL LIMIT 1""")
    finally:
        conn.close()


def test_processes_opening_at_once_upgrade_once(upgraded, previous: Path, tmp_path: Path):
    """The rebuild holds the write lock; another process opening meanwhile waits (busy timeout), then
    finds the file upgraded: both succeed, and the result is the same as one upgrade."""
    import subprocess
    import sys

    path = tmp_path / "racing.db"
    path.write_bytes(previous.read_bytes())
    code = f"from omnigent.store import Store; Store({str(path)!r}).close()"
    procs = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outcomes = [(proc.wait(timeout=60), proc.stderr.read()) for proc in procs]
    for proc in procs:
        proc.stderr.close()
    assert all(rc == 0 for rc, _ in outcomes), outcomes
    assert dump(path) == dump(upgraded[1])
    conn = sqlite3.connect(path)
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM additive_migrations WHERE name LIKE '000%'")]
    finally:
        conn.close()
    assert {"0007_agent_steps", "0008_item_and_turn_statuses"} <= set(names)
