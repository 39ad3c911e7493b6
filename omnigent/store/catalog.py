"""Managing sessions as a user sees them: search, fork, rename, delete.

Guarantees:
- `search_conversations` never raises on what a user types: the query is
  parsed into quoted terms (store/search.py), so only an empty query is
  refused (ValueError). It uses the FTS5 index where there is one, else LIKE.
- `fork_conversation` writes only the new conversation: the source's rows are
  untouched. It copies the committed items (see `_COMMITTED`) with new ids.
- `delete_conversation` removes the conversation and every row that names it
  in one transaction, in whichever table (found from the schema, so a table a
  later migration adds is covered too).

Needs `ConversationsMixin` (`get_conversation`, `update_conversation`) in the same `Store`.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from . import ids
from ._base import KIND_DEFAULT, Tables
from .conversations import _CONVERSATION_SELECT
from .errors import NotFoundError
from .search import (
    FTS_TABLE,
    INDEXED,
    LIKE_NOTE,
    MODE_FTS5,
    MODE_LIKE,
    ROWS_TABLE,
    excerpt,
    fts5_available,
    fts_query,
    has_index,
    index_pending,
    like_pattern,
    parse_query,
    pending,
    text_sql,
)

# An item is committed unless it belongs to a turn that is still under way or did not end
# well: a queued/running/waiting turn's items may still change, an interrupted one is to be
# retried, a failed one's are what the user was told failed. Items of no turn (user messages)
# and of turns of older releases whose row is gone are committed.
_COMMITTED = """(i.turn_id IS NULL OR NOT EXISTS (SELECT 1 FROM turns t WHERE t.id = i.turn_id
                 AND t.status NOT IN ('completed', 'cancelled')))"""
_SNIPPET_TOKENS = 12


class CatalogMixin(Tables):
    _search_mode: str | None = None

    # --- search --------------------------------------------------------------

    @property
    def search_mode(self) -> str:
        """"fts5" when this store has its full-text index (and it is not switched off), else "like"."""
        if self._search_mode is None:
            # the table alone is not enough: a Python without FTS5 may open a file that has one
            self._search_mode = MODE_FTS5 if has_index(self.conn) and fts5_available(self.conn) else MODE_LIKE
        return self._search_mode

    @property
    def search_note(self) -> str | None:
        """The one line to show a user when search is a plain substring match; None with FTS5."""
        return LIKE_NOTE if self.search_mode == MODE_LIKE else None

    def index_pending_messages(self) -> int:
        """Index the messages the search triggers queued (store/search.py); returns how many.

        A read when nothing is queued, else one write transaction. A search and the server's
        `search_indexing` task call it; every open catches up through `search.reconcile`."""
        if self.search_mode != MODE_FTS5 or not pending(self.conn):
            return 0
        with self._write():
            return index_pending(self.conn)

    def search_conversations(self, query: str, *, agent_name: str | None = None, limit: int = 20) -> list[dict]:
        """Conversations with a user or assistant message matching `query`, newest first.

        Rows as `list_conversations` gives them plus `snippet`: a one-line excerpt of the
        conversation's best-matching message (plain text). Raises ValueError on an empty query.
        """
        if not isinstance(query, str):
            raise TypeError("the search query must be a string")
        terms = parse_query(query)
        limit = int(limit)
        if limit < 1:
            raise ValueError("limit must be at least 1")
        match = fts_query(terms) if self.search_mode == MODE_FTS5 else None
        if match is not None:
            try:
                self.index_pending_messages()  # the newest messages are found too
            except sqlite3.OperationalError:
                pass  # a full disk, a lock held past the busy timeout: what is indexed is searched
            hits = self._fts_hits(match, agent_name, limit)
        else:
            hits = self._like_hits(terms, agent_name, limit)
        if not hits:
            return []
        order = [conv_id for conv_id, _ in hits]
        marks = ", ".join("?" * len(order))
        rows = {r["id"]: r for r in self._all(_CONVERSATION_SELECT + f" WHERE c.id IN ({marks})", order)}
        out = []
        for conv_id, snippet in hits:
            row = rows.get(conv_id)
            if row is not None:
                row["snippet"] = " ".join(snippet.split())
                out.append(row)
        return out

    def _scope(self, agent_name: str | None) -> tuple[str, list[Any]]:
        where = "c.kind = ?"
        params: list[Any] = [KIND_DEFAULT]
        if agent_name is not None:
            where += " AND c.agent_id = (SELECT id FROM agents WHERE name = ?)"
            params.append(agent_name)
        return where, params

    def _fts_hits(self, match: str, agent_name: str | None, limit: int) -> list[tuple[str, str]]:
        # each conversation's best message (lowest bm25 rank), the conversations newest first;
        # snippets are made only for the rows returned
        where, params = self._scope(agent_name)
        best = self.conn.execute(
            f"""WITH best AS (
                    SELECT r.conversation_id AS cid, {FTS_TABLE}.rowid AS hit, MIN({FTS_TABLE}.rank) AS score
                    FROM {FTS_TABLE} JOIN {ROWS_TABLE} r ON r.id = {FTS_TABLE}.rowid
                    WHERE {FTS_TABLE} MATCH ? GROUP BY r.conversation_id)
                SELECT c.id, best.hit FROM best JOIN conversations c ON c.id = best.cid
                WHERE {where} ORDER BY c.created_at DESC, c.id DESC LIMIT ?""",
            [match, *params, limit]).fetchall()
        if not best:
            return []
        marks = ", ".join("?" * len(best))
        snippets = dict(self.conn.execute(
            f"""SELECT rowid, snippet({FTS_TABLE}, 0, '', '', '…', {_SNIPPET_TOKENS}) FROM {FTS_TABLE}
                WHERE {FTS_TABLE} MATCH ? AND rowid IN ({marks})""", [match, *(hit for _, hit in best)]).fetchall())
        return [(conv_id, snippets.get(hit) or "") for conv_id, hit in best]

    def _like_hits(self, terms: list[str], agent_name: str | None, limit: int) -> list[tuple[str, str]]:
        # every term a substring of one message's text; each conversation's newest such message
        where, params = self._scope(agent_name)
        text = text_sql("i.data")
        likes = " AND ".join(f"{text} LIKE ? ESCAPE '\\'" for _ in terms)
        rows = self.conn.execute(
            f"""WITH hits AS (
                    SELECT i.conversation_id AS cid, MAX(i.position) AS pos FROM conversation_items i
                    WHERE {INDEXED.format(row="i")} AND {likes} GROUP BY i.conversation_id)
                SELECT c.id, (SELECT {text} FROM conversation_items i
                              WHERE i.conversation_id = c.id AND i.position = hits.pos)
                FROM hits JOIN conversations c ON c.id = hits.cid
                WHERE {where} ORDER BY c.created_at DESC, c.id DESC LIMIT ?""",
            [*(like_pattern(t) for t in terms), *params, limit]).fetchall()
        return [(conv_id, excerpt(found or "", terms)) for conv_id, found in rows]

    # --- fork ----------------------------------------------------------------

    def fork_conversation(self, conv_id: str, *, title: str | None = None,
                          up_to_response_id: str | None = None) -> dict:
        """A new conversation with copies of `conv_id`'s committed items (up to and including
        the item `up_to_response_id`, an item id or a response id), new ids, `forked_from` set.

        Same agent, pinned spec, workspace, host, permission mode, effort and model override;
        unbound (no runner), no turns. Title default: "<source title> (fork)". The source is
        not written. NotFoundError for an unknown conversation or item. Returns the new row.
        """
        if title is not None and not isinstance(title, str):
            raise TypeError("title must be a string or None")
        new_id = ids.new_id(ids.CONVERSATION)
        with self._write():
            src = self._one("""SELECT id, title, agent_id, reasoning_effort, model_override, workspace,
                                      permission_mode, host_id FROM conversations WHERE id = ?""", [conv_id])
            if src is None:
                raise NotFoundError(f"conversation {conv_id!r} not found")
            upto = None
            if up_to_response_id is not None:
                upto = self._fork_point(conv_id, up_to_response_id)
            now = self._after("updated_at", self._after("created_at", self._clock()))
            name = title if title is not None else (f"{src['title']} (fork)" if src["title"] else "(fork)")
            self.db.execute(
                """INSERT INTO conversations (id, kind, created_at, updated_at, title, agent_id, reasoning_effort,
                       model_override, workspace, permission_mode, host_id, forked_from, forked_at_item)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                [new_id, KIND_DEFAULT, now, now, name, src["agent_id"], src["reasoning_effort"],
                 src["model_override"], src["workspace"], src["permission_mode"], src["host_id"], conv_id,
                 upto[0] if upto else None])
            # the spec the source runs (its pinned one, else its named agent's) is the fork's
            self.db.execute(
                """INSERT INTO session_agents (conversation_id, spec, bundle, updated_at)
                   SELECT ?, COALESCE(s.spec, a.spec), s.bundle, ? FROM conversations c
                   LEFT JOIN session_agents s ON s.conversation_id = c.id
                   LEFT JOIN agents a ON a.id = c.agent_id
                   WHERE c.id = ? AND COALESCE(s.spec, a.spec) IS NOT NULL""", [new_id, now, conv_id])
            sql = f"""SELECT i.id, i.response_id, i.type, i.status, i.role, i.data, i.created_at
                      FROM conversation_items i WHERE i.conversation_id = ? AND {_COMMITTED}"""
            params: list[Any] = [conv_id]
            if upto is not None:
                sql += " AND i.position <= ?"
                params.append(upto[1])
            rows = self.conn.execute(sql + " ORDER BY i.position", params).fetchall()
            copies = []
            for position, (item_id, response_id, kind, status, role, data, created_at) in enumerate(rows):
                fresh = _fresh_id(item_id)
                stored = json.loads(data)
                if isinstance(stored, dict):
                    stored["id"] = fresh
                copies.append((fresh, new_id, None, response_id, None, position, kind, status, role,
                               json.dumps(stored), created_at))
            # the fork has no turns: its items carry no turn id (or output slot)
            self.conn.executemany(
                """INSERT INTO conversation_items (id, conversation_id, turn_id, response_id, output_index,
                       position, type, status, role, data, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                copies)
            self.db.execute("UPDATE conversations SET next_position = ? WHERE id = ?", [len(copies), new_id])
        return self.get_conversation(new_id)  # type: ignore[attr-defined,no-any-return]

    def _fork_point(self, conv_id: str, ref: str) -> tuple[str, int]:
        """(item id, position) of the item a fork ends at: the item `ref`, else the last item
        of the response `ref`."""
        row = self.conn.execute("SELECT id, position FROM conversation_items WHERE conversation_id = ? AND id = ?",
                                [conv_id, ref]).fetchone()
        if row is None:
            row = self.conn.execute(
                """SELECT id, position FROM conversation_items WHERE conversation_id = ? AND response_id = ?
                   ORDER BY position DESC LIMIT 1""", [conv_id, ref]).fetchone()
        if row is None:
            raise NotFoundError(f"item {ref!r} not found in {conv_id!r}")
        return row[0], row[1]

    # --- rename, delete -------------------------------------------------------

    def rename_conversation(self, conv_id: str, title: str) -> dict:
        """Set the title (NotFoundError when unknown); returns the row."""
        if not isinstance(title, str):
            raise TypeError("title must be a string")
        return self.update_conversation(conv_id, title=title)  # type: ignore[attr-defined,no-any-return]

    def delete_conversation(self, conv_id: str) -> None:
        """Remove the conversation and every row naming it (items, turns, steps, events,
        approvals, rules, claims, files, ...), in one transaction. NotFoundError when unknown.

        Its open turns are marked cancelled first, in the same transaction (a process
        running one finds its turn gone at its next write). Forks of it are kept.
        """
        with self._write():
            self._require_conversation(conv_id)
            self.db.execute("UPDATE turns SET status = 'cancelled', error = 'the session was deleted', ended_at = ?"
                            " WHERE conversation_id = ? AND status IN ('queued', 'running', 'waiting')",
                            [self._clock(), conv_id])
            # items first: their triggers drop the search index rows by the item's key
            for table in ("conversation_items", *self._conversation_tables()):
                self.db.execute(f'DELETE FROM "{table}" WHERE conversation_id = ?', [conv_id])
            self.db.execute("DELETE FROM conversations WHERE id = ?", [conv_id])

    def _conversation_tables(self) -> list[str]:
        """Every ordinary table with a `conversation_id` column, but the items (done first) and
        the search index's map (its rows follow the items: the triggers, or `search.reconcile`)."""
        tables = [r[0] for r in self.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND sql NOT LIKE 'CREATE VIRTUAL%' "
            "AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        return [t for t in tables if t not in ("conversation_items", ROWS_TABLE)
                and any(col[1] == "conversation_id" for col in self.conn.execute(f'PRAGMA table_info("{t}")'))]


def _fresh_id(old: str) -> str:
    """A new id of the same kind: an endpoint's `fc_...` stays `fc_...`, anything else `msg_...`."""
    prefix = old.split("_", 1)[0] if "_" in old else ids.MESSAGE
    try:
        return ids.new_id(prefix)
    except ValueError:
        return ids.new_id(ids.MESSAGE)

