"""Full-text search over the text of messages: the FTS5 index, kept in step by triggers, and its queries.

Why triggers: every path that writes `conversation_items` (appending a message, a
turn's output, a step's items, a pending message placed, a conversation deleted,
and whatever SQL an older release or another process runs on the same file) keeps
the index in step without the store having to remember it at each call site.

Layout (migration 0010, `create_search_index`; 0013, `index_in_batches`):
- `search_rows (id INTEGER PRIMARY KEY, conversation_id, item_id)`: one row per
  indexed message; its `id` is the FTS row's rowid. The item is named by its key,
  not by `conversation_items.rowid`, which a VACUUM may renumber.
- `search_text`: the FTS5 table (`unicode61` tokenizer), one row per user or
  assistant message, its text the message's text parts joined by spaces.

In batches: the triggers write only `search_rows` (a new or changed message is
queued); `index_pending` gives the FTS rows to every map row above the highest
rowid the FTS table holds, in id order, so "every row up to that rowid is
indexed" always holds (a delete takes both rows). An FTS5 insert commits a
segment of its own, and merges segments: per message, inside the turn's
transaction, it was the largest single cost of a turn on the server
(`bench_sessions.py` with `OMNIGENT_NO_FTS5=1`: ~10 % of its CPU, 64 against 80
turns/s). Now a search indexes what is pending first, so it never misses a
message; the server indexes every `INDEX_EVERY` s while its hub runs
(`server/search_indexing.py`), and every open of the store catches up.

The query language (`parse_query`) is deliberately small, so no user text can be an
FTS5 syntax error: the words of the query, or "quoted phrases", must all occur in
one message; each word matches as a prefix (`deploy` finds "deployment"). Nothing
is an operator: `AND`, `OR`, `NOT`, `*`, `-x`, `col:` and quotes inside a word are
text. A word without a letter or digit (`*`, `--`) is left out of the FTS query; a
query of only such words is matched as a substring (`LIKE`).

Without FTS5 in the local SQLite (or with `OMNIGENT_NO_FTS5=1`, for tests), 0010 is
recorded with no table and search matches every word as a substring (`LIKE`): a scan
of every message, and `LIKE_NOTE` for the user. One file may meet Pythons with and
without FTS5: `reconcile`, at every open, keeps the triggers only where FTS5 is, and
catches the index up when it comes back.
"""

from __future__ import annotations

import os
import re
import sqlite3
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

FTS_TABLE = "search_text"
ROWS_TABLE = "search_rows"
MODE_FTS5 = "fts5"
MODE_LIKE = "like"
LIKE_NOTE = "full-text search unavailable (SQLite without FTS5): using a plain substring match"
NO_FTS5_ENV = "OMNIGENT_NO_FTS5"
BACKFILL_NOTICE_AFTER = 1.0  # s: a backfill that takes longer says so on stderr
_BACKFILL_CHUNK = 2000

# Which items are indexed: user and assistant messages (tool calls and outputs are not text a
# person searches for; system prompts are not part of a conversation).
INDEXED = "{row}.type = 'message' AND {row}.role IN ('user', 'assistant')"


def text_sql(data: str) -> str:
    """SQL for the searchable text of a message's JSON `data`: its string content, or its
    content parts' `text` (and bare strings) joined by spaces; '' for anything else."""
    return f"""(CASE WHEN NOT json_valid({data}) THEN ''
        WHEN json_type({data}, '$.content') = 'text' THEN json_extract({data}, '$.content')
        WHEN json_type({data}, '$.content') = 'array' THEN COALESCE((
            SELECT group_concat(part, ' ') FROM (
                SELECT CASE WHEN type = 'text' THEN value
                            WHEN type = 'object' AND json_type(value, '$.text') = 'text'
                                THEN json_extract(value, '$.text') END AS part
                FROM json_each({data}, '$.content'))
            WHERE part IS NOT NULL), '')
        ELSE '' END)"""


def _triggers() -> str:
    """A new or changed message is queued (a map row above the indexed ones), a gone one forgotten."""
    key = "conversation_id = old.conversation_id AND item_id = old.id"
    forget = f"""
        DELETE FROM {FTS_TABLE} WHERE rowid = (SELECT id FROM {ROWS_TABLE} WHERE {key});
        DELETE FROM {ROWS_TABLE} WHERE {key};"""
    indexed = INDEXED.format(row="new")
    return f"""
    CREATE TRIGGER search_items_queue AFTER INSERT ON conversation_items WHEN {indexed}
    BEGIN
        INSERT INTO {ROWS_TABLE} (conversation_id, item_id) VALUES (new.conversation_id, new.id);
    END;
    CREATE TRIGGER search_items_delete AFTER DELETE ON conversation_items
    BEGIN{forget}
    END;
    CREATE TRIGGER search_items_requeue AFTER UPDATE OF id, conversation_id, type, role, data
        ON conversation_items
    BEGIN{forget}
        INSERT INTO {ROWS_TABLE} (conversation_id, item_id) SELECT new.conversation_id, new.id WHERE {indexed};
    END;
    """


def fts5_forced_off() -> bool:
    return os.environ.get(NO_FTS5_ENV, "") not in ("", "0")


def fts5_available(conn: sqlite3.Connection) -> bool:
    """This SQLite can create FTS5 tables (and the environment does not forbid it)."""
    if fts5_forced_off():
        return False
    try:
        conn.execute("CREATE VIRTUAL TABLE temp.omnigent_fts5_probe USING fts5(x)")
        conn.execute("DROP TABLE temp.omnigent_fts5_probe")
    except sqlite3.OperationalError:
        return False
    return True


def has_index(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                        [FTS_TABLE]).fetchone() is not None


def create_search_index(conn: sqlite3.Connection) -> None:
    """Migration 0010: the index, its triggers and a backfill of every message (caller's transaction).

    Says `indexing N messages…` on stderr once the backfill has taken longer than
    `BACKFILL_NOTICE_AFTER` s. Without FTS5 it creates nothing.
    """
    if fts5_available(conn):
        _create(conn)


def _create(conn: sqlite3.Connection) -> None:
    conn.execute(f"""CREATE TABLE {ROWS_TABLE} (
        id INTEGER PRIMARY KEY,
        conversation_id TEXT NOT NULL,
        item_id TEXT NOT NULL,
        UNIQUE (conversation_id, item_id))""")
    conn.execute(f"CREATE VIRTUAL TABLE {FTS_TABLE} USING fts5(text, tokenize = 'unicode61')")
    _create_triggers(conn)
    backfill(conn)


_TRIGGERS = ("search_items_queue", "search_items_delete", "search_items_requeue")
# before 0013 the insert and update triggers wrote the FTS row themselves, out of id order
_LEGACY_TRIGGERS = ("search_items_insert", "search_items_update")


def _drop_triggers(conn: sqlite3.Connection) -> None:
    for name in _TRIGGERS + _LEGACY_TRIGGERS:
        conn.execute(f"DROP TRIGGER IF EXISTS {name}")


def _create_triggers(conn: sqlite3.Connection) -> None:
    _drop_triggers(conn)
    for statement in _split(_triggers()):
        conn.execute(statement)


def index_in_batches(conn: sqlite3.Connection) -> None:
    """Migration 0013: the triggers queue messages instead of indexing them (caller's transaction).

    Nothing is pending when it runs (the old triggers indexed at once). Without an index there is
    nothing to change; a Python without FTS5 (on a file indexed by one with it) drops the
    triggers, as `reconcile` would, and the next process with FTS5 puts the new ones in place."""
    if not has_index(conn):
        return
    if fts5_available(conn):
        _create_triggers(conn)
        index_pending(conn)
    else:
        _drop_triggers(conn)


def pending(conn: sqlite3.Connection) -> bool:
    """Some message is queued and not indexed yet (two reads of a b-tree's last row)."""
    top = conn.execute(f"SELECT MAX(id) FROM {ROWS_TABLE}").fetchone()[0]
    return top is not None and top > conn.execute(f"SELECT COALESCE(MAX(rowid), 0) FROM {FTS_TABLE}").fetchone()[0]


def index_pending(conn: sqlite3.Connection, *, notice_after: float | None = None) -> int:
    """Give its FTS row to every map row above the highest indexed one, in id order (caller's
    transaction); returns how many. `notice_after`: as `backfill`'s."""
    notice_after = BACKFILL_NOTICE_AFTER if notice_after is None else notice_after
    started = time.monotonic()
    first = conn.execute(f"SELECT COALESCE(MAX(rowid), 0) FROM {FTS_TABLE}").fetchone()[0]
    total = conn.execute(f"SELECT COUNT(*) FROM {ROWS_TABLE} WHERE id > ?", [first]).fetchone()[0]
    told = False
    cursor = first
    while True:
        # chunks keyed by the map's id: progress is checked between them
        upto = conn.execute(f"SELECT MAX(id) FROM (SELECT id FROM {ROWS_TABLE} WHERE id > ? ORDER BY id LIMIT ?)",
                            [cursor, _BACKFILL_CHUNK]).fetchone()[0]
        if upto is None:
            break
        conn.execute(f"""INSERT INTO {FTS_TABLE} (rowid, text)
                         SELECT r.id, {text_sql("i.data")} FROM {ROWS_TABLE} r
                         JOIN conversation_items i ON i.conversation_id = r.conversation_id AND i.id = r.item_id
                         WHERE r.id > ? AND r.id <= ? ORDER BY r.id""", [cursor, upto])
        cursor = upto
        if not told and time.monotonic() - started > notice_after:
            print(f"indexing {total} messages…", file=sys.stderr, flush=True)
            told = True
    return total


def _state(conn: sqlite3.Connection) -> tuple[bool, int]:
    """(the index table exists, how many of its triggers do)."""
    marks = ", ".join("?" * len(_TRIGGERS))
    triggers = conn.execute(f"SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger' AND name IN ({marks})",
                            _TRIGGERS).fetchone()[0]
    return has_index(conn), triggers


def reconcile(conn: sqlite3.Connection, write: Callable[[], AbstractContextManager[None]]) -> None:
    """At every open, after the migrations: the index is live exactly where this SQLite has FTS5.

    One store file may be opened by Pythons built with and without FTS5. A process
    without it must not meet triggers that write an FTS5 table (every write of an item
    would fail with "no such module"), so it drops them; the index then falls behind,
    and the next process with FTS5 puts the triggers back and catches up (rows of gone
    items removed, new messages indexed). A store migrated without FTS5 gets its index
    built by the first process that has it. Messages queued by a process that stopped
    before it indexed them are indexed. Nothing is written when all is in order.
    """
    available = fts5_available(conn)
    table, triggers = _state(conn)
    if available and table and triggers == len(_TRIGGERS):
        if pending(conn):  # queued by a process that stopped before it indexed them
            with write():
                index_pending(conn)
        return
    if not available and not triggers:
        return
    with write():
        table, triggers = _state(conn)  # again, inside the lock: another process may have done it
        if not available:
            _drop_triggers(conn)
        elif not table:
            _create(conn)
        elif triggers < len(_TRIGGERS):
            _create_triggers(conn)
            conn.execute(f"""DELETE FROM {FTS_TABLE} WHERE rowid IN (SELECT r.id FROM {ROWS_TABLE} r
                             WHERE NOT EXISTS (SELECT 1 FROM conversation_items i
                                 WHERE i.conversation_id = r.conversation_id AND i.id = r.item_id))""")
            conn.execute(f"""DELETE FROM {ROWS_TABLE} WHERE NOT EXISTS (SELECT 1 FROM conversation_items i
                             WHERE i.conversation_id = {ROWS_TABLE}.conversation_id AND i.id = {ROWS_TABLE}.item_id)""")
            backfill(conn)


def backfill(conn: sqlite3.Connection, *, notice_after: float | None = None) -> int:
    """Index every message not yet indexed, oldest first; returns how many were.

    `notice_after` (default `BACKFILL_NOTICE_AFTER`): seconds after which it says so on stderr.
    """
    conn.execute(f"""INSERT INTO {ROWS_TABLE} (conversation_id, item_id)
                     SELECT i.conversation_id, i.id FROM conversation_items i
                     WHERE {INDEXED.format(row="i")} AND NOT EXISTS (SELECT 1 FROM {ROWS_TABLE} r
                         WHERE r.conversation_id = i.conversation_id AND r.item_id = i.id)
                     ORDER BY i.rowid""")
    return index_pending(conn, notice_after=notice_after)


def _split(script: str) -> list[str]:
    """The statements of a script (a trigger body's semicolons stay inside its statement)."""
    statements, current = [], ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            if current.strip():
                statements.append(current.strip())
            current = ""
    if current.strip():
        statements.append(current.strip())
    return statements


# --- queries -------------------------------------------------------------------


def parse_query(query: str) -> list[str]:
    """The terms of a query: its words, and its "quoted phrases" (a quote left open runs to the end).

    A quote opens a phrase only at the start of a word (`foo"bar` is one word).
    Raises ValueError when there is no term (empty, or only whitespace and quotes).
    """
    terms = []
    for phrase, word in _TERM.findall(query):
        term = " ".join(phrase.split()) if phrase or not word else word
        if term:
            terms.append(term)
    if not terms:
        raise ValueError("the search query is empty")
    return terms


_TERM = re.compile(r'"([^"]*)(?:"|$)|(\S+)')


def _tokenized(term: str) -> bool:
    # unicode61 keeps letters and digits (and private-use characters); the rest separates tokens
    return any(c.isalnum() for c in term)


def fts_query(terms: list[str]) -> str | None:
    """An FTS5 MATCH expression for the terms, every one a quoted prefix phrase; None when no
    term has a letter or digit (FTS5 would match nothing: the caller uses LIKE)."""
    kept = [t for t in terms if _tokenized(t)]
    if not kept:
        return None
    return " ".join('"' + t.replace('"', '""') + '"*' for t in kept)


def like_pattern(term: str) -> str:
    """`%term%` with LIKE's wildcards escaped (ESCAPE '\\')."""
    escaped = term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def excerpt(text: str, terms: list[str], *, width: int = 80) -> str:
    """A one-line excerpt of `text` around the first term found (case-insensitive), `…` where cut."""
    flat = " ".join(text.split())
    lowered = flat.lower()
    at = min((i for i in (lowered.find(t.lower()) for t in terms) if i >= 0), default=0)
    start = max(0, at - width // 3)
    end = min(len(flat), start + width)
    start = max(0, min(start, end - width))
    cut = flat[start:end]
    return ("…" if start > 0 else "") + cut + ("…" if end < len(flat) else "")
