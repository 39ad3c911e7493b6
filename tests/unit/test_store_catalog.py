"""The store's catalog (store/catalog.py, store/search.py): search, fork, rename, delete.

Search is checked in both modes (FTS5, and LIKE with FTS5 switched off), over every
path that writes items; fork and delete over every table that names a conversation.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from omnigent.store import KIND_SUB_AGENT, MIGRATIONS, NotFoundError, Store
from omnigent.store import search as store_search
from omnigent.store.catalog import CatalogMixin

OLD_STORE = Path(__file__).resolve().parents[1] / "resources" / "stores" / "chat-0.1.0.db"


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def assistant(text: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


@pytest.fixture
def store(tmp_path: Path):
    with Store(tmp_path / "chat.db") as s:
        yield s


@pytest.fixture
def like_store(tmp_path: Path, monkeypatch):
    monkeypatch.setenv(store_search.NO_FTS5_ENV, "1")
    with Store(tmp_path / "like.db") as s:
        yield s


def _conv(store: Store, agent: str = "helper", **kw) -> str:
    agent_id = (store.get_agent_by_name(agent) or store.upsert_agent(agent, {"name": agent, "model": "m"}))["id"]
    return store.create_conversation(agent_id=agent_id, **kw)["id"]


def _turn(store: Store, conv: str, question: str, answer: str | None, status: str = "completed") -> str:
    _, turn = store.queue_message(conv, user(question))
    store.start_turn(turn["id"], "runner_x")
    store.begin_step(conv, turn["id"], 0, "model")
    if answer is not None:
        store.finish_model_step(conv, turn["id"], 0, [assistant(answer)], f"resp_{turn['id'][-6:]}", None)
    if status != "running":
        store.finish_turn(turn["id"], status)
    return turn["id"]


def _ids(rows: list[dict]) -> list[str]:
    return [r["id"] for r in rows]


def _rows_of(store: Store, conv: str) -> dict[str, list[tuple]]:
    """Every row naming `conv`, table by table (and its own row)."""
    out = {"conversations": store.conn.execute("SELECT * FROM conversations WHERE id = ?", [conv]).fetchall()}
    for table in CatalogMixin._conversation_tables(store) + ["conversation_items", store_search.ROWS_TABLE]:
        out[table] = sorted(store.conn.execute(f"SELECT * FROM {table} WHERE conversation_id = ?", [conv]).fetchall(),
                            key=repr)
    return out


# --- search --------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["fts5", "like"])
def test_search_finds_messages_newest_first(request, mode):
    store = request.getfixturevalue("store" if mode == "fts5" else "like_store")
    assert store.search_mode == mode
    assert store.search_note == (None if mode == "fts5" else store_search.LIKE_NOTE)
    old = _conv(store)
    _turn(store, old, "How do I deploy the service?", "Run the deployment pipeline.")
    new = _conv(store)
    _turn(store, new, "deploy again", "Sure: café crème, naïve résumé")
    other = _conv(store, "other")
    _turn(store, other, "nothing to deploy here", "ok")
    sub = _conv(store, kind=KIND_SUB_AGENT)
    store.append_item(sub, user("deploy from a sub-agent"))

    assert _ids(store.search_conversations("deploy")) == [other, new, old]  # kind 2 is not listed
    assert _ids(store.search_conversations("deploy", agent_name="helper")) == [new, old]
    assert _ids(store.search_conversations("deploy", limit=1)) == [other]
    assert _ids(store.search_conversations("pipeline")) == [old]  # assistant text too
    assert _ids(store.search_conversations("résumé")) == [new]
    assert store.search_conversations("deploy pipeline")[0]["id"] == old  # every word in one message
    assert store.search_conversations("deploy crème") == [] if mode == "fts5" else True
    hit = store.search_conversations("pipeline")[0]
    assert "deployment pipeline" in hit["snippet"] and "\n" not in hit["snippet"]
    listed = {r["id"]: r for r in store.list_conversations()}
    assert {k: v for k, v in hit.items() if k != "snippet"} == listed[old]
    assert store.search_conversations("absent-word") == []
    for empty in ("", "   ", '""'):
        with pytest.raises(ValueError):
            store.search_conversations(empty)


@pytest.mark.parametrize("mode", ["fts5", "like"])
def test_user_text_is_never_query_syntax(request, mode):
    store = request.getfixturevalue("store" if mode == "fts5" else "like_store")
    conv = _conv(store)
    store.append_item(conv, user('she said foo"bar AND 100% of under_score -x NEAR(a b) col:val'))
    hostile = ['foo"bar', "AND", "OR", "NOT", "*", "-x", "(", ")", "col:val", '"unclosed', "^", "NEAR(a b)",
               "a AND OR b", "100%", "under_score", "'", "\\", "{x}", "+", ":", "%", "_"]
    for query in hostile:
        store.search_conversations(query)  # never an FTS syntax error
    for query in ['foo"bar', "AND", "-x", "100%", "under_score", "col:val", "NEAR(a b)"]:
        assert _ids(store.search_conversations(query)) == [conv], query
    if mode == "like":  # LIKE's wildcards are literal: `_` and `%` match themselves only
        assert store.search_conversations("under%score") == [] and store.search_conversations("10_%") == []
    else:  # FTS5 reads punctuation as a break between words
        assert _ids(store.search_conversations("under%score")) == [conv]


def test_words_match_as_prefixes_and_phrases_in_order(store):
    conv = _conv(store)
    store.append_item(conv, user("the quick brown fox"))
    assert _ids(store.search_conversations("qui bro")) == [conv]
    assert _ids(store.search_conversations('"quick brown"')) == [conv]
    assert store.search_conversations('"brown quick"') == []
    assert store.search_conversations("uick") == []  # a prefix, not any substring (FTS5)
    assert store_search.parse_query('a "b  c" d"e') == ["a", "b c", 'd"e']


def test_every_write_path_keeps_the_index_in_step(store):
    conv = _conv(store)
    store.append_item(conv, user("appended alpha"))
    turn = store.create_turn(conv, None)
    store.append_turn_output(conv, turn["id"], [assistant("output bravo")], "resp_1")
    store.finish_turn(turn["id"], "completed")
    _turn(store, conv, "queued charlie", "step delta")
    store.create_turn(conv, None)  # a turn queued: the next message waits in pending_items
    _, busy = store.queue_message(conv, user("pending echo"))
    assert store.search_conversations("echo") == []
    store.place_pending(conv, busy["input_item_id"])
    store.append_item(conv, {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "foxtrot"})
    store.append_item(conv, {"type": "message", "role": "system", "content": "golf"})
    for word in ("alpha", "bravo", "charlie", "delta", "echo"):
        assert _ids(store.search_conversations(word)) == [conv], word
    for word in ("foxtrot", "golf"):  # tool calls and system messages are not indexed
        assert store.search_conversations(word) == []
    # any SQL that rewrites or removes an item (another process, an older release) is followed
    with store._write():
        store.conn.execute("""UPDATE conversation_items SET data = json_set(data, '$.content[0].text', 'hotel')
                              WHERE conversation_id = ? AND data LIKE '%alpha%'""", [conv])
        store.conn.execute("DELETE FROM conversation_items WHERE conversation_id = ? AND data LIKE '%bravo%'",
                           [conv])
    assert store.search_conversations("alpha") == [] and store.search_conversations("bravo") == []
    assert _ids(store.search_conversations("hotel")) == [conv]
    rows, text = (store.conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                  for t in (store_search.ROWS_TABLE, store_search.FTS_TABLE))
    assert rows == text == store.conn.execute(
        "SELECT COUNT(*) FROM conversation_items WHERE type = 'message' AND role IN ('user', 'assistant')").fetchone()[0]


def _index_counts(store: Store) -> tuple[int, int]:
    """(map rows, FTS rows); also checks the batches' invariant: every map row up to the highest
    indexed rowid has its FTS row."""
    conn = store.conn
    top = conn.execute(f"SELECT COALESCE(MAX(rowid), 0) FROM {store_search.FTS_TABLE}").fetchone()[0]
    assert conn.execute(f"""SELECT COUNT(*) FROM {store_search.ROWS_TABLE} r WHERE r.id <= ? AND NOT EXISTS
                            (SELECT 1 FROM {store_search.FTS_TABLE} t WHERE t.rowid = r.id)""", [top]).fetchone() == (0,)
    return tuple(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]  # type: ignore[return-value]
                 for t in (store_search.ROWS_TABLE, store_search.FTS_TABLE))


def test_messages_are_queued_by_the_triggers_and_indexed_in_batches(store):
    """A turn's transaction only queues its messages (the FTS5 insert, a segment per commit, was the
    largest single cost of a turn); a search indexes what is queued before it reads."""
    conv = _conv(store)
    store.append_item(conv, user("first india"))
    store.append_item(conv, user("second juliet"))
    assert _index_counts(store) == (2, 0)  # queued
    assert _ids(store.search_conversations("india")) == [conv]
    assert _index_counts(store) == (2, 2)
    assert store.index_pending_messages() == 0  # nothing left: a read
    # changed while others are queued: the changed one is queued again, above them, never out of order
    store.append_item(conv, user("third kilo"))
    with store._write():
        store.conn.execute("""UPDATE conversation_items SET data = json_set(data, '$.content[0].text', 'lima')
                              WHERE conversation_id = ? AND data LIKE '%india%'""", [conv])
    store.append_item(conv, user("fourth mike"))
    with store._write():  # a queued one removed before it was indexed
        store.conn.execute("DELETE FROM conversation_items WHERE data LIKE '%fourth mike%'")
    assert _index_counts(store) == (3, 1)
    assert store.index_pending_messages() == 2
    assert _index_counts(store) == (3, 3)
    for word, found in (("india", []), ("lima", [conv]), ("kilo", [conv]), ("juliet", [conv]), ("mike", [])):
        assert _ids(store.search_conversations(word)) == found, word
    with store._write():  # the highest indexed one removed: the next batch starts below it, and fits
        store.conn.execute("DELETE FROM conversation_items WHERE data LIKE '%lima%'")
    store.append_item(conv, user("fifth november"))
    assert _ids(store.search_conversations("november")) == [conv]
    assert _index_counts(store) == (3, 3)


def test_messages_queued_by_a_process_that_stopped_are_indexed_at_the_next_open(tmp_path: Path):
    path = tmp_path / "chat.db"
    with Store(path) as store:
        conv = _conv(store)
        store.append_item(conv, user("left queued"))
        assert _index_counts(store) == (1, 0)
    with Store(path) as store:
        assert _index_counts(store) == (1, 1)
        assert _ids(store.search_conversations("queued")) == [conv]


_LEGACY_INSERT_TRIGGER = f"""CREATE TRIGGER search_items_insert AFTER INSERT ON conversation_items
    WHEN {store_search.INDEXED.format(row="new")}
    BEGIN
        INSERT INTO {store_search.ROWS_TABLE} (conversation_id, item_id) VALUES (new.conversation_id, new.id);
        INSERT INTO {store_search.FTS_TABLE} (rowid, text) VALUES (last_insert_rowid(),
                                                                   {store_search.text_sql("new.data")});
    END"""


def test_0013_puts_queueing_triggers_in_place_of_the_indexing_ones(tmp_path: Path):
    """A store indexed by the triggers before 0013 keeps every message findable and queues from then on."""
    path = tmp_path / "chat.db"
    with Store(path) as store:
        conv = _conv(store)
        with store._write():  # as before 0013: the insert trigger indexed at once
            for name in ("search_items_queue", "search_items_requeue"):
                store.conn.execute(f"DROP TRIGGER {name}")
            store.conn.execute(_LEGACY_INSERT_TRIGGER)
            store.conn.execute("DELETE FROM additive_migrations WHERE name = '0013_search_index_in_batches'")
        store.append_item(conv, user("indexed at once"))
        assert _index_counts(store) == (1, 1)
    with Store(path) as store:
        triggers = {r[0] for r in store.conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        assert triggers == {"search_items_queue", "search_items_delete", "search_items_requeue"}
        assert "0013_search_index_in_batches" in {r[0] for r in store.conn.execute(
            "SELECT name FROM additive_migrations")}
        store.append_item(conv, user("queued now"))
        assert _index_counts(store) == (2, 1)
        assert _ids(store.search_conversations("once")) == _ids(store.search_conversations("queued")) == [conv]


def _pre_search_store(path: Path, conversations: int, per_conv: int) -> None:
    """A store at the schema before 0010, filled with raw SQL (as 0.1.0 wrote: string and part content)."""
    conn = sqlite3.connect(path)
    with conn:
        conn.executescript("""CREATE TABLE migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL);
                              CREATE TABLE additive_migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL);""")
        for migration in MIGRATIONS[:-1]:
            conn.executescript(migration.sql)
            conn.execute(f"INSERT INTO {'additive_migrations' if migration.additive else 'migrations'} "
                         "VALUES (?, 1.0)", [migration.name])
        conn.execute("INSERT INTO agents (id, name, spec, created_at, updated_at) VALUES ('ag_1', 'old', '{}', 1, 1)")
        rows = []
        for c in range(conversations):
            cid = f"conv_{c:032x}"
            conn.execute("INSERT INTO conversations (id, created_at, updated_at, agent_id, next_position) "
                         "VALUES (?, ?, ?, 'ag_1', ?)", [cid, c, c, per_conv])
            for p in range(per_conv):
                role = ("user", "assistant")[p % 2]
                content = (f'"question {c}.{p} about topic{p % 7}"' if p % 4 == 0 else
                           f'[{{"type": "output_text", "text": "answer {c}.{p} on topic{p % 7}"}}]')
                rows.append((f"msg_{c}_{p}", cid, p, role, f'{{"role": "{role}", "content": {content}}}'))
        conn.executemany("INSERT INTO conversation_items (id, conversation_id, position, type, role, data, created_at)"
                         " VALUES (?, ?, ?, 'message', ?, ?, 1.0)", rows)
    conn.close()


def test_the_migration_backfills_and_says_so_when_slow(tmp_path: Path, monkeypatch, capsys):
    path = tmp_path / "chat.db"
    _pre_search_store(path, 20, 10)
    monkeypatch.setattr(store_search, "BACKFILL_NOTICE_AFTER", -1.0)  # "slow" at once
    with Store(path) as store:
        assert store.search_mode == "fts5"
        assert "indexing 200 messages…" in capsys.readouterr().err
        assert _ids(store.search_conversations("question 3.4")) == [f"conv_{3:032x}"]
        assert len(store.search_conversations("topic2", limit=100)) == 20
        assert store.search_conversations("answer 5.1")[0]["snippet"] == "answer 5.1 on topic1"
    with Store(path):
        assert capsys.readouterr().err == ""  # once


def test_without_fts5_the_migration_is_recorded_with_no_table(tmp_path: Path, monkeypatch):
    path = tmp_path / "chat.db"
    _pre_search_store(path, 3, 4)
    monkeypatch.setenv(store_search.NO_FTS5_ENV, "1")
    with Store(path) as store:
        names = {r[0] for r in store.conn.execute("SELECT name FROM additive_migrations")}
        assert "0010_items_fts" in names
        assert not store_search.has_index(store.conn)
        assert store.search_mode == "like" and store.search_note == store_search.LIKE_NOTE
        assert _ids(store.search_conversations("question 2.0")) == [f"conv_{2:032x}"]
        conv = f"conv_{1:032x}"
        store.append_item(conv, user("written without an index"))  # no trigger to trip over
        assert _ids(store.search_conversations("without an")) == [conv]
        store.delete_conversation(f"conv_{0:032x}")
        assert store.search_conversations("question 0.0") == []
    monkeypatch.delenv(store_search.NO_FTS5_ENV)
    with Store(path) as store:  # the first process with FTS5 builds the index
        assert store.search_mode == "fts5"
        assert _ids(store.search_conversations("without an")) == [conv]
        assert _ids(store.search_conversations("question 2.0")) == [f"conv_{2:032x}"]


def test_a_process_without_fts5_drops_the_triggers_and_the_next_one_catches_up(tmp_path: Path, monkeypatch):
    path = tmp_path / "chat.db"
    with Store(path) as store:
        conv = _conv(store)
        store.append_item(conv, user("indexed before"))
        store.append_item(conv, user("removed while off"))
        doomed = _conv(store)
        store.append_item(doomed, user("a whole session deleted while off"))
    monkeypatch.setenv(store_search.NO_FTS5_ENV, "1")  # as a Python whose SQLite has no FTS5
    with Store(path) as store:
        assert store.search_mode == "like"
        assert store.conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger'").fetchone() == (0,)
        store.append_item(conv, user("written while off"))  # no trigger names a module it lacks
        with store._write():
            store.conn.execute("DELETE FROM conversation_items WHERE data LIKE '%removed while%'")
        store.delete_conversation(doomed)
    monkeypatch.delenv(store_search.NO_FTS5_ENV)
    with Store(path) as store:
        assert store.search_mode == "fts5"
        assert _ids(store.search_conversations("written while")) == [conv]
        assert store.search_conversations("removed while") == [] and store.search_conversations("whole") == []
        assert _ids(store.search_conversations("indexed before")) == [conv]
        store.append_item(conv, user("after the repair"))
        assert _ids(store.search_conversations("repair")) == [conv]
        rows, text = (store.conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                      for t in (store_search.ROWS_TABLE, store_search.FTS_TABLE))
        assert rows == text == 3


def test_fts5_switched_off_on_an_indexed_store_uses_like(store, monkeypatch):
    conv = _conv(store)
    store.append_item(conv, user("something findable"))
    monkeypatch.setenv(store_search.NO_FTS5_ENV, "1")
    store._search_mode = None
    assert store.search_mode == "like"
    assert _ids(store.search_conversations("ndab")) == [conv]  # a substring now


# --- fork ------------------------------------------------------------------------


def test_fork_copies_committed_items_and_leaves_the_source_alone(store):
    src = _conv(store, title="Plans", reasoning_effort="high", model_override="m2", workspace="/w",
                permission_mode="ask")
    store.pin_session_agent(src, {"name": "helper", "model": "pinned"}, b"bundle")
    store.upsert_agent("helper", {"name": "helper", "model": "uploaded later"})
    _turn(store, src, "first", "answer one")
    _turn(store, src, "second", "broken", status="failed")
    _turn(store, src, "third", "answer three")
    store.add_rule(src, "shell", "ls")
    store.create_file(src, "a.txt", b"a")
    store.append_events(src, [{"type": "session.status", "status": "idle"}])
    _turn(store, src, "fourth", "still going", status="running")
    before = _rows_of(store, src)

    fork = store.fork_conversation(src)
    assert _rows_of(store, src) == before
    assert fork["forked_from"] == src and fork["forked_at_item"] is None
    assert fork["kind"] == 1 and fork["title"] == "Plans (fork)" and fork["runner_id"] is None
    assert (fork["agent_id"], fork["reasoning_effort"], fork["model_override"], fork["workspace"],
            fork["permission_mode"]) == (store.get_conversation(src)["agent_id"], "high", "m2", "/w", "ask")
    assert store.session_spec(fork["id"]) == {"name": "helper", "model": "pinned"}
    items = store.list_items(fork["id"])
    texts = [(i["role"], i["content"][0]["text"]) for i in items]
    # the failed turn's answer and the running turn's are not committed; the user messages are
    assert texts == [("user", "first"), ("assistant", "answer one"), ("user", "second"),
                     ("user", "third"), ("assistant", "answer three"), ("user", "fourth")]
    source_ids = {i["id"] for i in store.list_items(src)}
    assert not source_ids & {i["id"] for i in items}
    assert fork["item_count"] == len(items) and store.list_turns(fork["id"]) == []
    assert store.list_rules(fork["id"]) == [] and store.list_files(fork["id"]) == []
    assert fork["id"] in _ids(store.list_conversations())
    assert _ids(store.search_conversations("answer three")) == [fork["id"], src]
    # the fork goes on by itself
    _turn(store, fork["id"], "fifth", "forked answer")
    assert _rows_of(store, src) == before
    assert store.get_conversation(src)["forked_from"] is None


def test_fork_up_to_an_item_or_a_response(store):
    src = _conv(store)
    _turn(store, src, "one", "uno")
    _turn(store, src, "two", "dos")
    items = store.list_items(src)
    at_item = store.fork_conversation(src, up_to_response_id=items[1]["id"], title="named")
    assert at_item["title"] == "named" and at_item["forked_at_item"] == items[1]["id"]
    assert [i["content"][0]["text"] for i in store.list_items(at_item["id"])] == ["one", "uno"]
    at_response = store.fork_conversation(src, up_to_response_id=items[3]["response_id"])
    assert len(store.list_items(at_response["id"])) == 4
    assert store.fork_conversation(src, up_to_response_id=items[0]["id"])["item_count"] == 1
    with pytest.raises(NotFoundError):
        store.fork_conversation(src, up_to_response_id="msg_elsewhere")
    with pytest.raises(NotFoundError):
        store.fork_conversation("conv_missing")
    untitled = _conv(store)
    assert store.fork_conversation(untitled)["title"] == "(fork)"
    assert store.fork_conversation(at_item["id"])["forked_from"] == at_item["id"]  # a fork of a fork


# --- rename, delete ---------------------------------------------------------------


def test_rename(store):
    conv = _conv(store)
    assert store.rename_conversation(conv, "New name")["title"] == "New name"
    with pytest.raises(NotFoundError):
        store.rename_conversation("conv_missing", "x")


def test_delete_removes_every_row_of_the_session_only(store):
    keep = _conv(store)
    _turn(store, keep, "keep me", "kept")
    gone = _conv(store)
    _turn(store, gone, "remove me", "removed")
    store.append_turn_output(gone, store.create_turn(gone, None)["id"], [assistant("removed too")], "resp_2")
    running = _turn(store, gone, "mid-turn", None, status="running")
    store.create_approval(gone, running, 1, "c1", "shell", "{}", "rm -rf", None, None)
    store.add_rule(gone, "shell", "ls")
    store.create_file(gone, "a.txt", b"a")
    store.append_events(gone, [{"type": "session.status", "status": "running"}])
    store.compact_events(gone, 0)
    with store._write():
        store.conn.execute("INSERT OR REPLACE INTO session_event_floors VALUES (?, 3)", [gone])
    from omnigent.store.owners import ClaimOwner
    assert store.claim_conversation(gone, ClaimOwner.this_process(), turn_id=running, lease=60)
    store.queue_message(gone, user("pending while busy"))
    fork = store.fork_conversation(gone)["id"]
    kept_before = _rows_of(store, keep)
    tables = _rows_of(store, gone)
    assert [t for t in ("conversation_items", "turns", "turn_steps", "approvals", "approval_rules",
                                   "files", "session_events", "session_event_floors", "conversation_claims",
                                   "pending_items", "session_agents", "turn_outputs", "search_rows") if not tables[t]] == []

    store.delete_conversation(gone)
    assert all(rows == [] for rows in _rows_of(store, gone).values())
    assert store.get_conversation(gone) is None and store.get_turn(running) is None
    assert _rows_of(store, keep) == kept_before
    assert _ids(store.search_conversations("removed")) == [fork]  # the fork's copy only
    assert _ids(store.search_conversations("kept")) == [keep]
    assert store.get_conversation(fork)["forked_from"] == gone  # the fork stays, and says where it came from
    assert store.conn.execute("PRAGMA foreign_key_check").fetchall() == []
    with pytest.raises(NotFoundError):
        store.delete_conversation(gone)


# --- the previous release's store ---------------------------------------------------


def test_the_0_1_0_store_upgrades_searches_forks_and_deletes(tmp_path: Path):
    path = tmp_path / "chat.db"
    shutil.copy(OLD_STORE, path)
    with Store(path) as store:
        assert store.search_mode == "fts5"
        [hit] = store.search_conversations("legacy answer 42.1")
        assert hit["snippet"] == "legacy answer 42.1"
        assert len(store.search_conversations("legacy", limit=1000)) == 100
        assert len(store.search_conversations("legacy", agent_name="legacy-chat", limit=1000)) == 50
        # conversation 9 ends in a failed turn: its question is kept, there was no answer
        [failed] = [r for r in store.search_conversations("legacy question 9.1")]
        fork = store.fork_conversation(failed["id"])
        assert [i["content"][0]["text"] for i in store.list_items(fork["id"])] == [
            "legacy question 9.0", "legacy answer 9.0", "legacy question 9.1"]
        assert store.session_spec(fork["id"]) == store.session_spec(failed["id"])
        store.delete_conversation(failed["id"])
        assert store.search_conversations("legacy answer 9.0")[0]["id"] == fork["id"]
        assert store.conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def test_a_search_that_cannot_index_what_is_queued_searches_what_is_indexed(store, monkeypatch):
    """A full disk (or a lock held past the busy timeout) fails the batch, not the search."""
    conv = _conv(store)
    store.append_item(conv, user("indexed oscar"))
    assert _ids(store.search_conversations("oscar")) == [conv]
    store.append_item(conv, user("queued papa"))

    def full_disk() -> int:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(store, "index_pending_messages", full_disk)
    assert _ids(store.search_conversations("oscar")) == [conv]
    assert store.search_conversations("papa") == []
    monkeypatch.undo()
    assert _ids(store.search_conversations("papa")) == [conv]


def test_0013_on_a_python_without_fts5_drops_the_triggers_and_the_next_one_puts_the_new_ones(
        tmp_path: Path, monkeypatch):
    path = tmp_path / "chat.db"
    with Store(path) as store:
        conv = _conv(store)
        with store._write():  # indexed by the triggers before 0013
            for name in ("search_items_queue", "search_items_requeue"):
                store.conn.execute(f"DROP TRIGGER {name}")
            store.conn.execute(_LEGACY_INSERT_TRIGGER)
            store.conn.execute("DELETE FROM additive_migrations WHERE name = '0013_search_index_in_batches'")
        store.append_item(conv, user("before quebec"))
    monkeypatch.setenv(store_search.NO_FTS5_ENV, "1")
    with Store(path) as store:
        assert store.conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger'").fetchone() == (0,)
        store.append_item(conv, user("while off romeo"))
    monkeypatch.delenv(store_search.NO_FTS5_ENV)
    with Store(path) as store:
        assert _ids(store.search_conversations("quebec")) == _ids(store.search_conversations("romeo")) == [conv]
        assert _index_counts(store) == (2, 2)
