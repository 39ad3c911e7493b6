"""Unit tests for omnigent.store: every public method, on throwaway files."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from omnigent.store import (
    ANY,
    MIGRATIONS,
    ConflictError,
    NotFoundError,
    Store,
    StoreError,
    default_data_dir,
    default_db_path,
    derive_title,
    is_id,
    migrate,
    new_id,
)

S1_QUERY = "SELECT id FROM conversations WHERE kind = 1 ORDER BY updated_at DESC, id DESC"
from omnigent.store.db import applied_migrations

_RECORDS_SQL = "SELECT name, applied_at FROM migrations UNION ALL SELECT name, applied_at FROM additive_migrations"


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def assistant(text: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


class Clock:
    """A settable clock, so timestamp ordering is tested without sleeping."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "chat.db"


@pytest.fixture
def store(path: Path):
    with Store(path) as s:
        yield s


@pytest.fixture
def agent(store: Store) -> dict:
    return store.upsert_agent("helper", {"name": "helper", "model": "m"}, b"tgz")


@pytest.fixture
def conv(store: Store, agent: dict) -> dict:
    return store.create_conversation(agent_id=agent["id"])


# -- paths and ids -------------------------------------------------------------


def test_default_data_dir_reads_env_at_call_time(monkeypatch, tmp_path):
    monkeypatch.delenv("OMNIGENT_DATA_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_data_dir() == tmp_path / "home" / ".omnigent"
    assert default_db_path() == tmp_path / "home" / ".omnigent" / "chat.db"
    monkeypatch.setenv("OMNIGENT_DATA_DIR", str(tmp_path / "data"))
    assert default_data_dir() == tmp_path / "data"
    assert default_db_path() == tmp_path / "data" / "chat.db"


def test_new_id_format():
    for prefix in ("conv", "ag", "turn", "msg", "resp", "runner"):
        value = new_id(prefix)
        assert value.startswith(prefix + "_") and len(value) == len(prefix) + 33
        assert is_id(value, prefix)
    assert new_id("conv") != new_id("conv")
    assert not is_id("conv_xyz", "conv")
    assert not is_id(new_id("msg"), "conv")
    with pytest.raises(ValueError):
        new_id("bad prefix")


# -- opening -------------------------------------------------------------------


def test_open_creates_parent_and_sets_pragmas(store: Store, path: Path):
    assert path.exists()
    pragma = lambda name: store.conn.execute(f"PRAGMA {name}").fetchone()[0]  # noqa: E731
    assert pragma("journal_mode") == "wal"
    assert pragma("foreign_keys") == 1
    assert pragma("synchronous") == 1  # NORMAL
    assert pragma("busy_timeout") == 5000
    assert applied_migrations(store.db) == {m.name for m in MIGRATIONS}
    tables = {r[0] for r in store.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"agents", "conversations", "conversation_items", "turns", "files", "migrations"} <= tables


def test_migrations_idempotent_on_reopen(path: Path):
    with Store(path) as s:
        first = s.conn.execute(_RECORDS_SQL).fetchall()
        agent = s.upsert_agent("a", {})
        conv_id = s.create_conversation(agent_id=agent["id"])["id"]
    with Store(path) as s:
        assert s.conn.execute(_RECORDS_SQL).fetchall() == first
        assert migrate(s.db) == []
        assert s.get_conversation(conv_id)["agent_name"] == "a"


def test_unknown_migration_refused(path: Path):
    with Store(path) as s:
        s.conn.execute("INSERT INTO migrations VALUES ('9999_future', 0)")
        s.conn.commit()
    with pytest.raises(StoreError, match="newer omnigent"):
        Store(path)


def test_directory_path_is_a_store_error(tmp_path: Path):
    with pytest.raises(StoreError) as info:
        Store(tmp_path)
    assert "directory" in str(info.value) and "\n" not in str(info.value)


def test_unwritable_location_is_a_store_error(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError) as info:
        Store(blocker / "sub" / "chat.db")
    assert "cannot create" in str(info.value) and "\n" not in str(info.value)


def test_not_sqlite_file_is_refused_untouched(tmp_path: Path):
    bogus = tmp_path / "chat.db"
    content = b"this is not a database, just text\n" * 200
    bogus.write_bytes(content)
    with pytest.raises(StoreError) as info:
        Store(bogus)
    assert "\n" not in str(info.value)
    assert bogus.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.db"]


def test_foreign_sqlite_file_is_refused_untouched(tmp_path: Path):
    foreign = tmp_path / "other.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE notes (x)")
    conn.commit()
    conn.close()
    before = foreign.read_bytes()
    with pytest.raises(StoreError, match="not an omnigent store"):
        Store(foreign)
    assert foreign.read_bytes() == before


def test_empty_file_becomes_a_store(tmp_path: Path):
    empty = tmp_path / "chat.db"
    empty.touch()
    with Store(empty) as s:
        assert s.list_conversations() == []


def test_memory_store_and_close(tmp_path: Path):
    with Store(":memory:") as s:
        assert s.upsert_agent("a", {})["name"] == "a"
    s = Store(tmp_path / "x.db")
    s.close()
    with pytest.raises(sqlite3.ProgrammingError):
        s.list_conversations()


def test_s1_raw_query(store: Store, agent: dict, path: Path):
    a = store.create_conversation(agent_id=agent["id"])
    b = store.create_conversation(agent_id=agent["id"])
    store.create_conversation(agent_id=agent["id"], kind=2)
    conn = sqlite3.connect(path)
    assert conn.execute(S1_QUERY).fetchall() == [(b["id"],), (a["id"],)]
    store.append_item(a["id"], user("again"))
    assert conn.execute(S1_QUERY).fetchall() == [(a["id"],), (b["id"],)]
    assert all(isinstance(r[0], str) for r in conn.execute(S1_QUERY))
    conn.close()


# -- agents --------------------------------------------------------------------


def test_upsert_agent_inserts_then_updates_in_place(store: Store):
    first = store.upsert_agent("bot", {"v": 1}, b"one")
    assert is_id(first["id"], "ag")
    assert first["spec"] == {"v": 1} and first["bundle"] == b"one"
    assert set(first) == {"id", "name", "spec", "bundle", "created_at", "updated_at"}
    conv = store.create_conversation(agent_id=first["id"])
    store.append_item(conv["id"], user("hi"))

    second = store.upsert_agent("bot", {"v": 2}, None)
    assert second["id"] == first["id"]
    assert second["spec"] == {"v": 2} and second["bundle"] is None
    assert second["created_at"] == first["created_at"]
    assert second["updated_at"] >= first["updated_at"]
    assert store.count_items(conv["id"]) == 1
    assert store.get_conversation(conv["id"])["agent_id"] == first["id"]
    assert store.conn.execute("SELECT COUNT(*) FROM agents").fetchone()[0] == 1


def test_get_agent(store: Store, agent: dict):
    assert store.get_agent(agent["id"]) == agent
    assert store.get_agent_by_name("helper") == agent
    assert store.get_agent("ag_missing") is None
    assert store.get_agent_by_name("nobody") is None
    with pytest.raises(ValueError):
        store.upsert_agent("", {})


# -- conversations -------------------------------------------------------------


def test_create_and_get_conversation(store: Store, agent: dict):
    conv = store.create_conversation(
        agent_id=agent["id"], title="T", reasoning_effort="high", model_override="m2", workspace="/w"
    )
    assert is_id(conv["id"], "conv")
    assert conv == {
        "id": conv["id"],
        "kind": 1,
        "created_at": conv["created_at"],
        "updated_at": conv["created_at"],
        "title": "T",
        "agent_id": agent["id"],
        "agent_name": "helper",
        "runner_id": None,
        "reasoning_effort": "high",
        "model_override": "m2",
        "workspace": "/w",
        "generation": 0,
        "permission_mode": None,
        "item_count": 0,
        "message_count": 0,
        "forked_from": None,
        "forked_at_item": None,
    }
    assert store.get_conversation("conv_missing") is None
    assert store.create_conversation(agent_id=agent["id"], kind=2)["kind"] == 2
    assert store.create_conversation(agent_id=None)["agent_name"] is None


def test_create_conversation_validation(store: Store):
    with pytest.raises(ValueError):
        store.create_conversation(agent_id=None, kind=3)
    with pytest.raises(NotFoundError):
        store.create_conversation(agent_id="ag_missing")


def test_get_conversation_counts(store: Store, conv: dict):
    store.append_item(conv["id"], user("a"))
    store.append_item(conv["id"], {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"})
    store.append_item(conv["id"], assistant("b"))
    got = store.get_conversation(conv["id"])
    assert got["item_count"] == 3 and got["message_count"] == 2


def test_update_conversation(store: Store, conv: dict):
    got = store.update_conversation(conv["id"], title="New", reasoning_effort="low", model_override="x", workspace="/p")
    assert (got["title"], got["reasoning_effort"], got["model_override"], got["workspace"]) == ("New", "low", "x", "/p")
    assert got["updated_at"] == conv["updated_at"]  # metadata is not activity
    assert store.update_conversation(conv["id"], model_override=None)["model_override"] is None
    assert store.update_conversation(conv["id"])["title"] == "New"
    with pytest.raises(TypeError):
        store.update_conversation(conv["id"], runner_id="runner_x")
    with pytest.raises(NotFoundError):
        store.update_conversation("conv_missing", title="x")


def test_updated_at_bumped_on_every_append_and_strictly_ordered(path: Path):
    clock = Clock()  # frozen: ordering must not depend on the clock moving
    with Store(path, clock=clock) as s:
        agent = s.upsert_agent("a", {})
        a = s.create_conversation(agent_id=agent["id"])
        b = s.create_conversation(agent_id=agent["id"])
        assert b["created_at"] > a["created_at"] and b["updated_at"] > a["updated_at"]
        ids = lambda **kw: [c["id"] for c in s.list_conversations(**kw)]  # noqa: E731
        assert ids(sort_by="updated_at") == [b["id"], a["id"]]
        s.append_item(a["id"], user("x"))
        assert ids(sort_by="updated_at") == [a["id"], b["id"]]
        assert ids(sort_by="created_at") == [b["id"], a["id"]]
        before = s.get_conversation(a["id"])["updated_at"]
        s.append_item(a["id"], assistant("y"))
        assert s.get_conversation(a["id"])["updated_at"] > before
        s.append_item(b["id"], user("z"))
        assert ids(sort_by="updated_at") == [b["id"], a["id"]]
        clock.now += 100
        s.append_item(a["id"], user("later"))
        assert s.get_conversation(a["id"])["updated_at"] == clock.now


def test_list_conversations_order_kind_agent_limit(store: Store):
    a1 = store.upsert_agent("one", {})
    a2 = store.upsert_agent("two", {})
    convs = [store.create_conversation(agent_id=(a1 if i % 2 == 0 else a2)["id"]) for i in range(6)]
    sub = store.create_conversation(agent_id=a1["id"], kind=2)
    all_ids = [c["id"] for c in convs]
    ids = lambda **kw: [c["id"] for c in store.list_conversations(**kw)]  # noqa: E731

    assert ids() == all_ids[::-1]
    assert ids(order="asc") == all_ids
    assert ids(limit=2) == all_ids[::-1][:2]
    assert ids(limit=None) == all_ids[::-1]
    assert ids(kind=2) == [sub["id"]]
    assert ids(kind=None) == [sub["id"], *all_ids[::-1]]
    assert ids(agent_name="one") == all_ids[::2][::-1]
    assert ids(agent_name="one", kind=None, order="asc") == [*all_ids[::2], sub["id"]]
    assert ids(agent_id=a2["id"]) == all_ids[1::2][::-1]
    assert ids(agent_name="nobody") == []
    listed = store.list_conversations(limit=1)[0]
    assert listed["agent_name"] == "two" and listed["message_count"] == 0
    with pytest.raises(ValueError):
        store.list_conversations(order="sideways")
    with pytest.raises(ValueError):
        store.list_conversations(sort_by="title")


def test_list_conversations_cursors(store: Store, agent: dict):
    all_ids = [store.create_conversation(agent_id=agent["id"])["id"] for _ in range(6)]
    desc = all_ids[::-1]
    ids = lambda **kw: [c["id"] for c in store.list_conversations(**kw)]  # noqa: E731
    assert ids(after=desc[1], limit=2) == desc[2:4]
    assert ids(before=desc[4], limit=2) == desc[2:4]
    assert ids(after=desc[0], before=desc[3]) == desc[1:3]
    assert ids(order="asc", after=all_ids[1], limit=2) == all_ids[2:4]
    assert ids(order="asc", before=all_ids[4], limit=2) == all_ids[2:4]
    assert ids(after=desc[-1]) == []
    # paging through with `after` visits everything once
    seen, cursor = [], None
    while page := ids(after=cursor, limit=4, sort_by="updated_at"):
        seen += page
        cursor = page[-1]
    assert seen == desc
    with pytest.raises(NotFoundError):
        store.list_conversations(after="conv_missing")


def test_list_conversations_10k(store: Store, agent: dict):
    other = store.upsert_agent("other", {})
    rows = [
        (f"conv_{i:032x}", 1 if i % 10 else 2, 1000.0 + i, 5000.0 - i, agent["id"] if i % 3 else other["id"])
        for i in range(10_000)
    ]
    with store.conn:
        store.conn.executemany(
            "INSERT INTO conversations (id, kind, created_at, updated_at, agent_id) VALUES (?, ?, ?, ?, ?)", rows
        )
    statements: list[str] = []
    store.conn.set_trace_callback(statements.append)
    got = store.list_conversations(limit=20)
    assert [c["id"] for c in got] == [f"conv_{i:032x}" for i in range(9999, -1, -1) if i % 10][:20]
    page1 = store.list_conversations(limit=20, sort_by="updated_at", agent_name="other")
    page2 = store.list_conversations(limit=20, sort_by="updated_at", agent_name="other", after=page1[-1]["id"])
    both = page1 + page2
    assert len({c["id"] for c in both}) == 40 and all(c["agent_name"] == "other" for c in both)
    assert [c["updated_at"] for c in both] == sorted((c["updated_at"] for c in both), reverse=True)
    assert store.list_conversations(limit=3, order="asc", sort_by="updated_at")[0]["id"] == f"conv_{9999:032x}"
    store.conn.set_trace_callback(None)
    listings = [sql for sql in statements if "FROM conversations c" in sql]
    assert len(listings) == 4
    for sql in listings:
        plan = " | ".join(r[3] for r in store.conn.execute("EXPLAIN QUERY PLAN " + sql))
        assert "USING INDEX" in plan and "TEMP B-TREE" not in plan, plan
    assert len(sqlite3.connect(store.path).execute(S1_QUERY).fetchall()) == 9000


# -- runner binding ------------------------------------------------------------


def test_bind_runner_compare_and_set(store: Store, conv: dict):
    cid = conv["id"]
    assert store.bind_runner(cid, "runner_a", expected=None) is True
    assert store.get_conversation(cid)["runner_id"] == "runner_a"
    assert store.bind_runner(cid, "runner_b", expected=None) is False
    assert store.bind_runner(cid, "runner_b", expected="runner_x") is False
    assert store.get_conversation(cid)["runner_id"] == "runner_a"
    assert store.bind_runner(cid, "runner_b", expected="runner_a") is True
    assert store.bind_runner(cid, "runner_c", expected=ANY) is True
    assert store.get_conversation(cid)["runner_id"] == "runner_c"
    assert store.bind_runner(cid, None, expected="runner_c") is True
    assert store.get_conversation(cid)["runner_id"] is None
    with pytest.raises(NotFoundError):
        store.bind_runner("conv_missing", "runner_a", expected=None)
    assert store.get_conversation(cid)["updated_at"] == conv["updated_at"]


def test_set_runner(store: Store, conv: dict):
    store.set_runner(conv["id"], "runner_a")
    store.set_runner(conv["id"], "runner_b")
    assert store.get_conversation(conv["id"])["runner_id"] == "runner_b"
    store.set_runner(conv["id"], "")
    assert store.get_conversation(conv["id"])["runner_id"] is None
    store.set_runner(conv["id"], "runner_c")
    store.set_runner(conv["id"], None)
    assert store.get_conversation(conv["id"])["runner_id"] is None


def test_rebind_runner(store: Store, agent: dict):
    convs = [store.create_conversation(agent_id=agent["id"])["id"] for _ in range(4)]
    for cid in convs[:3]:
        store.set_runner(cid, "runner_old")
    store.set_runner(convs[3], "runner_other")
    moved = store.rebind_runner("runner_old", "runner_new")
    assert moved == sorted(convs[:3])
    assert [store.get_conversation(c)["runner_id"] for c in convs] == ["runner_new"] * 3 + ["runner_other"]
    assert store.conversations_for_runner("runner_new") == sorted(convs[:3])
    assert store.rebind_runner("runner_old", "runner_new") == []


# -- items ---------------------------------------------------------------------


def test_append_item_wire_form_and_positions(store: Store, conv: dict):
    first = store.append_item(conv["id"], user("hi"), response_id="resp_1")
    assert is_id(first["id"], "msg")
    assert first == {
        "id": first["id"],
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "hi"}],
        "status": "completed",
        "response_id": "resp_1",
        "created_at": first["created_at"],
    }
    second = store.append_item(conv["id"], {**assistant("yo"), "id": "msg_given", "model": "m"})
    assert second["id"] == "msg_given" and second["model"] == "m" and second["response_id"] is None
    third = store.append_item(conv["id"], {"type": "reasoning", "summary": [], "status": "in_progress"})
    assert third["status"] == "in_progress"
    fourth = store.append_item(conv["id"], {"type": "error", "message": "boom"}, status="failed", turn_id="turn_1")
    assert fourth["status"] == "failed"
    positions = store.conn.execute(
        "SELECT id, position, turn_id FROM conversation_items WHERE conversation_id = ? ORDER BY position",
        [conv["id"]],
    ).fetchall()
    assert positions == [(first["id"], 0, None), ("msg_given", 1, None), (third["id"], 2, None), (fourth["id"], 3, "turn_1")]
    assert store.count_items(conv["id"]) == 4
    assert store.list_items(conv["id"]) == [first, second, third, fourth]
    assert store.get_item(conv["id"], "msg_given") == second
    assert store.get_item(conv["id"], "msg_nope") is None
    assert store.get_conversation(conv["id"])["item_count"] == 4


def test_append_item_errors_leave_no_trace(store: Store, conv: dict):
    store.append_item(conv["id"], {**user("a"), "id": "msg_dup"})
    with pytest.raises(ConflictError):
        store.append_item(conv["id"], {**user("b"), "id": "msg_dup"})
    with pytest.raises(ValueError):
        store.append_item(conv["id"], {"content": "no type"})
    with pytest.raises(ValueError):
        store.append_item(conv["id"], user("x"), status="weird")
    with pytest.raises(TypeError):
        store.append_item(conv["id"], "not a dict")  # type: ignore[arg-type]
    with pytest.raises(NotFoundError):
        store.append_item("conv_missing", user("x"))
    assert store.count_items(conv["id"]) == 1
    assert store.get_conversation(conv["id"])["item_count"] == 1
    assert not store.conn.in_transaction
    assert store.append_item(conv["id"], user("c"))["id"] != "msg_dup"


def test_derive_title():
    assert derive_title(user("  hello \n\t world  ")) == "hello world"
    long = "word " * 30
    title = derive_title(user(long))
    assert len(title) == 60 and title.endswith("…") and title.startswith("word word")
    assert derive_title(user("x" * 60)) == "x" * 60
    assert derive_title(user("x" * 61)) == "x" * 59 + "…"
    assert derive_title({"type": "message", "role": "user", "content": "plain string"}) == "plain string"
    multi = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_image"}, {"type": "input_text", "text": "b"}]}
    assert derive_title(multi) == "a b"
    assert derive_title(assistant("no")) == ""
    assert derive_title({"type": "function_call", "role": "user"}) == ""


def test_title_from_first_user_message(store: Store, agent: dict):
    conv = store.create_conversation(agent_id=agent["id"])
    store.append_item(conv["id"], assistant("greeting first"))
    assert store.get_conversation(conv["id"])["title"] == ""
    store.append_item(conv["id"], {"type": "message", "role": "user", "content": [{"type": "input_image"}]})
    assert store.get_conversation(conv["id"])["title"] == ""
    store.append_item(conv["id"], user("  What   is\nthe answer " + "?" * 80))
    title = store.get_conversation(conv["id"])["title"]
    assert title.startswith("What is the answer ?") and len(title) == 60 and title.endswith("…")
    store.append_item(conv["id"], user("second question"))
    assert store.get_conversation(conv["id"])["title"] == title

    titled = store.create_conversation(agent_id=agent["id"], title="Mine")
    store.append_item(titled["id"], user("ignored"))
    assert store.get_conversation(titled["id"])["title"] == "Mine"


def test_list_items_paging(store: Store, conv: dict):
    items = [store.append_item(conv["id"], user(str(i))) for i in range(10)]
    ids = lambda **kw: [i["id"] for i in store.list_items(conv["id"], **kw)]  # noqa: E731
    all_ids = [i["id"] for i in items]
    assert ids() == all_ids
    assert ids(order="desc") == all_ids[::-1]
    assert ids(limit=3) == all_ids[:3]
    assert ids(after=all_ids[2], limit=3) == all_ids[3:6]
    assert ids(before=all_ids[5]) == all_ids[:5]
    assert ids(order="desc", after=all_ids[5], limit=2) == [all_ids[4], all_ids[3]]
    assert ids(after=all_ids[-1]) == []
    assert store.list_items("conv_missing") == []
    with pytest.raises(NotFoundError):
        store.list_items(conv["id"], after="msg_nope")
    with pytest.raises(ValueError):
        store.list_items(conv["id"], order="up")


def test_list_items_1000_turns_is_one_query(store: Store, conv: dict):
    for i in range(1000):
        turn = store.create_turn(conv["id"], None)
        store.append_item(conv["id"], user(f"q{i}"), turn_id=turn["id"])
        store.append_turn_output(conv["id"], turn["id"], [assistant(f"a{i}")], f"resp_{i}")
    statements: list[str] = []
    store.conn.set_trace_callback(statements.append)
    items = store.list_items(conv["id"])
    store.conn.set_trace_callback(None)
    assert len(statements) == 1
    assert len(items) == 2000
    assert [i["content"][0]["text"] for i in items[:4]] == ["q0", "a0", "q1", "a1"]
    assert items[-1]["response_id"] == "resp_999"


# -- turn output ---------------------------------------------------------------


def test_append_turn_output_exactly_once(store: Store, conv: dict):
    cid = conv["id"]
    question = store.append_item(cid, user("q"))
    turn = store.create_turn(cid, question["id"])
    out = [{"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c1"}, {**assistant("answer"), "model": "m"}]
    before = store.get_conversation(cid)["updated_at"]
    assert store.append_turn_output(cid, turn["id"], out, "resp_a") is True
    after = store.get_conversation(cid)
    assert after["updated_at"] > before and after["title"] == "q" and after["item_count"] == 3
    # a late completion from a dead attempt, with other content: ignored
    assert store.append_turn_output(cid, turn["id"], [assistant("late")], "resp_b") is False
    items = store.list_items(cid)
    assert [i["type"] for i in items] == ["message", "function_call", "message"]
    assert items[2]["content"][0]["text"] == "answer" and items[2]["response_id"] == "resp_a"
    assert items[2]["model"] == "m"
    rows = store.conn.execute(
        "SELECT turn_id, output_index, position FROM conversation_items WHERE conversation_id = ? ORDER BY position",
        [cid],
    ).fetchall()
    assert rows == [(None, None, 0), (turn["id"], 0, 1), (turn["id"], 1, 2)]
    assert store.get_turn(turn["id"])["output_persisted"] is True


def test_append_turn_output_empty_and_errors(store: Store, conv: dict):
    cid = conv["id"]
    assert store.append_turn_output(cid, "turn_empty", [], None) is True
    assert store.append_turn_output(cid, "turn_empty", [assistant("late")], None) is False
    assert store.count_items(cid) == 0
    with pytest.raises(NotFoundError):
        store.append_turn_output("conv_missing", "turn_x", [assistant("a")], None)
    # a bad item rolls back the claim too, so a correct retry still lands
    with pytest.raises(ValueError):
        store.append_turn_output(cid, "turn_bad", [assistant("ok"), {"no": "type"}], None)
    assert store.count_items(cid) == 0
    assert store.append_turn_output(cid, "turn_bad", [assistant("ok")], None) is True
    assert store.count_items(cid) == 1


# -- turns ---------------------------------------------------------------------


def test_turn_lifecycle(store: Store, conv: dict):
    item = store.append_item(conv["id"], user("q"))
    turn = store.create_turn(conv["id"], item["id"])
    assert is_id(turn["id"], "turn")
    assert turn == {
        "id": turn["id"],
        "conversation_id": conv["id"],
        "input_item_id": item["id"],
        "status": "queued",
        "attempt": 0,
        "runner_id": None,
        "owner_pid": os.getpid(),
        "error": None,
        "created_at": turn["created_at"],
        "started_at": None,
        "ended_at": None,
        "generation": None,
        "output_persisted": False,
        "usage": None,
        "approval_timeout": None,
        "step": None,
    }
    running = store.start_turn(turn["id"], "runner_a", 4242)
    assert (running["status"], running["attempt"], running["runner_id"], running["owner_pid"]) == (
        "running",
        1,
        "runner_a",
        4242,
    )
    assert running["started_at"] is not None
    assert store.mark_interrupted(turn["id"])["status"] == "interrupted"
    again = store.start_turn(turn["id"], "runner_b")
    assert (again["status"], again["attempt"], again["runner_id"], again["owner_pid"]) == ("running", 2, "runner_b", 4242)
    assert again["ended_at"] is None
    # the dead attempt's report is stale
    assert store.finish_turn(turn["id"], "failed", "old runner died", attempt=1) is None
    done = store.finish_turn(turn["id"], "completed", attempt=2)
    assert done["status"] == "completed" and done["ended_at"] is not None and done["error"] is None
    assert store.finish_turn(turn["id"], "failed", "too late") is None
    assert store.mark_interrupted(turn["id"]) is None
    assert store.get_turn(turn["id"])["status"] == "completed"
    with pytest.raises(ConflictError):
        store.start_turn(turn["id"], "runner_c")


def test_one_statement_writes_join_an_event_transaction_without_a_savepoint(store: Store, conv: dict):
    """Inside an event transaction a write of one statement needs no savepoint: one that fails (or
    refuses) leaves the transaction's other writes in place, and they commit together."""
    turn = store.create_turn(conv["id"], None)
    ended = store.create_turn(conv["id"], None)
    store.finish_turn(ended["id"], "cancelled")
    statements: list[str] = []
    store.conn.set_trace_callback(statements.append)
    with store.event_transaction():
        store.append_events(conv["id"], [{"type": "session.status", "status": "running"}])
        running = store.start_turn(turn["id"], "runner_a", 1)
        with pytest.raises(ConflictError):
            store.start_turn(ended["id"], "runner_a", 1)  # refused: nothing of it is written
        with pytest.raises(sqlite3.IntegrityError):  # fails inside SQLite, which undoes that statement
            store.conn.execute("INSERT INTO turns (id, conversation_id, status, created_at) VALUES (?, ?, ?, 0)",
                               [turn["id"], conv["id"], "queued"])
        done = store.finish_turn(turn["id"], "completed")
    store.conn.set_trace_callback(None)
    assert running["status"] == "running" and done["status"] == "completed"
    assert not [s for s in statements if s.startswith("SAVEPOINT")], statements
    assert statements.count("BEGIN IMMEDIATE") == 1
    assert store.get_turn(turn["id"])["status"] == "completed"
    assert store.get_turn(ended["id"])["status"] == "cancelled"
    assert [e["type"] for e in store.read_events(conv["id"], 0)] == ["session.status"]


def test_turn_errors(store: Store, conv: dict):
    turn = store.create_turn(conv["id"], None)
    with pytest.raises(ValueError):
        store.finish_turn(turn["id"], "running")
    failed = store.finish_turn(turn["id"], "failed", "model error")
    assert failed["status"] == "failed" and failed["error"] == "model error"
    assert store.get_turn("turn_missing") is None
    for call in (
        lambda: store.start_turn("turn_missing", "r"),
        lambda: store.finish_turn("turn_missing", "completed"),
        lambda: store.mark_interrupted("turn_missing"),
        lambda: store.create_turn("conv_missing", None),
        lambda: store.queue_message("conv_missing", {"type": "message", "role": "user", "content": "hi"}),
    ):
        with pytest.raises(NotFoundError):
            call()
    cancelled = store.finish_turn(store.create_turn(conv["id"], None)["id"], "cancelled")
    assert cancelled["status"] == "cancelled"


def test_list_turns_and_next_queued(store: Store, agent: dict):
    clock = Clock()
    store._clock = clock  # same-timestamp turns must still come out in creation order
    conv = store.create_conversation(agent_id=agent["id"])
    other = store.create_conversation(agent_id=agent["id"])
    turns = [store.create_turn(conv["id"], None) for _ in range(3)]
    store.create_turn(other["id"], None)
    assert [t["id"] for t in store.list_turns(conv["id"])] == [t["id"] for t in turns]
    assert store.next_queued_turn(conv["id"])["id"] == turns[0]["id"]
    store.start_turn(turns[0]["id"], "runner_a")
    assert store.next_queued_turn(conv["id"])["id"] == turns[1]["id"]
    assert [t["id"] for t in store.list_turns(conv["id"], status="running")] == [turns[0]["id"]]
    for t in turns[1:]:
        store.finish_turn(t["id"], "cancelled")
    assert store.next_queued_turn(conv["id"]) is None
    assert store.list_turns("conv_missing") == []


def test_interrupt_runner_turns(store: Store, conv: dict):
    a = store.start_turn(store.create_turn(conv["id"], None)["id"], "runner_dead")
    b = store.start_turn(store.create_turn(conv["id"], None)["id"], "runner_alive")
    c = store.create_turn(conv["id"], None)
    got = store.interrupt_runner_turns("runner_dead")
    assert [t["id"] for t in got] == [a["id"]] and got[0]["status"] == "interrupted"
    assert store.get_turn(b["id"])["status"] == "running"
    assert store.get_turn(c["id"])["status"] == "queued"
    assert store.interrupt_runner_turns("runner_dead") == []


def test_interrupt_orphaned_turns(store: Store, conv: dict):
    dead_running = store.start_turn(store.create_turn(conv["id"], None, owner_pid=111)["id"], "r", 111)
    dead_queued = store.create_turn(conv["id"], None, owner_pid=111)
    alive_running = store.start_turn(store.create_turn(conv["id"], None, owner_pid=222)["id"], "r", 222)
    dead_done = store.create_turn(conv["id"], None, owner_pid=333)
    store.finish_turn(dead_done["id"], "completed")
    checked: list[int] = []

    def alive(pid: int) -> bool:
        checked.append(pid)
        return pid == 222

    got = store.interrupt_orphaned_turns(alive)
    assert sorted(t["id"] for t in got) == sorted([dead_running["id"], dead_queued["id"]])
    assert all(t["status"] == "interrupted" and t["ended_at"] is not None for t in got)
    assert sorted(checked) == [111, 222]  # once per pid, finished turns not considered
    assert store.get_turn(alive_running["id"])["status"] == "running"
    assert store.get_turn(dead_done["id"])["status"] == "completed"
    assert store.interrupt_orphaned_turns(alive) == []


# -- files ---------------------------------------------------------------------


def test_files(store: Store, conv: dict):
    meta = store.create_file(conv["id"], "notes.txt", b"hello", "text/plain")
    assert is_id(meta["id"], "file")
    assert meta == {
        "id": meta["id"],
        "conversation_id": conv["id"],
        "filename": "notes.txt",
        "bytes": 5,
        "content_type": "text/plain",
        "created_at": meta["created_at"],
    }
    second = store.create_file(conv["id"], "b.bin", b"\x00\x01")
    assert store.get_file(meta["id"]) == {**meta, "data": b"hello"}
    assert store.get_file("file_missing") is None
    assert store.list_files(conv["id"]) == [meta, second]
    assert store.list_files("conv_missing") == []
    with pytest.raises(NotFoundError):
        store.create_file("conv_missing", "x", b"")


def test_unknown_additive_migration_tolerated(path: Path):
    """A newer release's additive change (new tables, defaulted columns) leaves the file usable here."""
    with Store(path) as s:
        s.conn.execute("INSERT INTO additive_migrations VALUES ('9999_future_table', 0)")
        s.conn.execute("CREATE TABLE future_things (id TEXT PRIMARY KEY)")
        s.conn.commit()
    with Store(path) as s:
        assert "9999_future_table" in applied_migrations(s.db)
        assert s.create_conversation(agent_id=s.upsert_agent("a", {})["id"])["id"]


def test_additive_names_recorded_as_strict_move_where_older_releases_do_not_look(path: Path):
    """Stores of this release line recorded every migration in `migrations`; 0.1.0 refused them."""
    with Store(path) as s:
        s.conn.execute("INSERT INTO migrations SELECT name, applied_at FROM additive_migrations")
        s.conn.execute("DELETE FROM additive_migrations")
        s.conn.commit()
    with Store(path) as s:
        strict = {r[0] for r in s.conn.execute("SELECT name FROM migrations")}
        assert strict == {m.name for m in MIGRATIONS if not m.additive} == {"0001_initial"}
        assert applied_migrations(s.db) == {m.name for m in MIGRATIONS}
