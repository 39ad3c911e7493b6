"""The store: agents, conversations, their items, turns and files in SQLite.

The server is its only writer inside a process; other omnigent processes may
write the same file. It is synchronous on purpose: each call is well under a
millisecond (WAL + synchronous=NORMAL), so trio tasks call it directly.
Every method returns plain dicts with JSON columns decoded, so nothing above
the store sees sqlite rows. One Store belongs to one thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from . import ids
from .db import open_database, write_transaction
from .errors import ConflictError, NotFoundError, StoreError
from .owners import ClaimOwner, owner_alive

KIND_DEFAULT = 1
KIND_SUB_AGENT = 2

ITEM_STATUSES = frozenset({"completed", "in_progress", "incomplete", "failed"})
TURN_STATUSES = frozenset({"queued", "running", "completed", "failed", "interrupted", "cancelled"})
TURN_TERMINAL = frozenset({"completed", "failed", "cancelled"})
# A turn in one of these can still be (re)started, finished or interrupted.
TURN_OPEN = ("queued", "running", "interrupted")

TITLE_MAX = 60
CONVERSATION_FIELDS = frozenset({"title", "reasoning_effort", "model_override", "workspace"})

# Smallest step that keeps REAL epoch timestamps distinct (float ulp near 2e9 is ~2.4e-7).
_TICK = 1e-6


class _Any:
    """Sentinel for `bind_runner(expected=ANY)`: bind whatever is bound now."""

    def __repr__(self) -> str:
        return "ANY"


ANY: Any = _Any()


def derive_title(item: dict) -> str:
    """Title for a conversation from a user message item, '' if it has no text.

    Whitespace is collapsed; longer than 60 characters is cut to 59 plus '…'.
    """
    if item.get("type", "message") != "message" or item.get("role") != "user":
        return ""
    text = " ".join(_content_text(item.get("content")).split())
    if len(text) > TITLE_MAX:
        text = text[: TITLE_MAX - 1].rstrip() + "…"
    return text


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return " ".join(parts)
    return ""


_CONVERSATION_SELECT = """
    SELECT c.id, c.kind, c.created_at, c.updated_at, c.title, c.agent_id,
           a.name AS agent_name, c.runner_id, c.reasoning_effort,
           c.model_override, c.workspace, c.next_position AS item_count,
           (SELECT COUNT(*) FROM conversation_items i
             WHERE i.conversation_id = c.id AND i.type = 'message') AS message_count
    FROM conversations c LEFT JOIN agents a ON a.id = c.agent_id
"""

_TURN_SELECT = """
    SELECT t.id, t.conversation_id, t.input_item_id, t.status, t.attempt,
           t.runner_id, t.owner_pid, t.error, t.created_at, t.started_at,
           t.ended_at, o.turn_id IS NOT NULL AS output_persisted
    FROM turns t LEFT JOIN turn_outputs o ON o.turn_id = t.id
"""

_ITEM_SELECT = "SELECT id, type, status, response_id, created_at, data FROM conversation_items"

_FILE_META = "id, conversation_id, filename, bytes, content_type, created_at"


class Store:
    """All persistent state of an omnigent server, in one SQLite file.

    `Store(path)` opens (creating the file and its directory if needed) and
    migrates; use it as a context manager or call `close()`.
    """

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = path if str(path) == ":memory:" else Path(path).expanduser()
        self._clock = clock
        self.db = open_database(self.path, clock=clock)
        self.conn = self.db.conn

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers -------------------------------------------------------------

    def _write(self) -> contextlib.AbstractContextManager[None]:
        return write_transaction(self.conn)

    def _one(self, sql: str, params: Iterable[Any] = ()) -> dict | None:
        return next(iter(self.db.query(sql, list(params))), None)

    def _all(self, sql: str, params: Iterable[Any] = ()) -> list[dict]:
        return list(self.db.query(sql, list(params)))

    def _scalar(self, sql: str, params: Iterable[Any] = ()) -> Any:
        row = self.conn.execute(sql, list(params)).fetchone()
        return row[0] if row else None

    def _after(self, column: str, now: float) -> float:
        # Strictly after every existing value: "newest" stays unambiguous even
        # for two writes within the clock's resolution or a clock step back.
        latest = self._scalar(f"SELECT MAX({column}) FROM conversations")
        return now if latest is None or now > latest else latest + _TICK

    # -- agents --------------------------------------------------------------

    def upsert_agent(self, name: str, spec: dict, bundle: bytes | None = None) -> dict:
        """Create the agent `name`, or update its spec and bundle in place.

        Never delete-and-recreate: conversations reference the agent's id.
        """
        if not name:
            raise ValueError("agent name must not be empty")
        spec_json = json.dumps(spec)
        with self._write():
            now = self._clock()
            agent_id = self._scalar("SELECT id FROM agents WHERE name = ?", [name])
            if agent_id is None:
                agent_id = ids.new_id(ids.AGENT)
                self.db.execute(
                    "INSERT INTO agents (id, name, spec, bundle, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                    [agent_id, name, spec_json, bundle, now, now],
                )
            else:
                self.db.execute(
                    "UPDATE agents SET spec = ?, bundle = ?, updated_at = ? WHERE id = ?",
                    [spec_json, bundle, now, agent_id],
                )
        return self.get_agent(agent_id)  # type: ignore[return-value]

    def get_agent(self, agent_id: str) -> dict | None:
        return _agent(self._one("SELECT * FROM agents WHERE id = ?", [agent_id]))

    def get_agent_by_name(self, name: str) -> dict | None:
        return _agent(self._one("SELECT * FROM agents WHERE name = ?", [name]))

    # -- conversations -------------------------------------------------------

    def create_conversation(
        self,
        *,
        agent_id: str | None,
        title: str = "",
        reasoning_effort: str | None = None,
        model_override: str | None = None,
        workspace: str | None = None,
        kind: int = KIND_DEFAULT,
    ) -> dict:
        if kind not in (KIND_DEFAULT, KIND_SUB_AGENT):
            raise ValueError(f"conversation kind must be 1 or 2, not {kind!r}")
        conv_id = ids.new_id(ids.CONVERSATION)
        with self._write():
            if agent_id is not None and self._scalar("SELECT 1 FROM agents WHERE id = ?", [agent_id]) is None:
                raise NotFoundError(f"agent {agent_id!r} not found")
            # A new conversation is the newest by both orderings.
            now = self._after("updated_at", self._after("created_at", self._clock()))
            self.db.execute(
                """INSERT INTO conversations (id, kind, created_at, updated_at, title, agent_id,
                       reasoning_effort, model_override, workspace)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                [conv_id, kind, now, now, title or "", agent_id, reasoning_effort, model_override, workspace],
            )
        return self.get_conversation(conv_id)  # type: ignore[return-value]

    def get_conversation(self, conv_id: str) -> dict | None:
        return self._one(_CONVERSATION_SELECT + " WHERE c.id = ?", [conv_id])

    def _require_conversation(self, conv_id: str) -> None:
        if self._scalar("SELECT 1 FROM conversations WHERE id = ?", [conv_id]) is None:
            raise NotFoundError(f"conversation {conv_id!r} not found")

    def list_conversations(
        self,
        *,
        limit: int | None = 20,
        agent_name: str | None = None,
        agent_id: str | None = None,
        order: str = "desc",
        sort_by: str = "created_at",
        kind: int | None = KIND_DEFAULT,
        before: str | None = None,
        after: str | None = None,
    ) -> list[dict]:
        """Conversations in `sort_by` order (ties broken by id), newest first by default.

        `after`/`before` are conversation ids (cursors): only rows that come
        after/before that one in this listing order. `kind=None` lists all kinds.
        """
        if order not in ("asc", "desc"):
            raise ValueError(f"order must be 'asc' or 'desc', not {order!r}")
        if sort_by not in ("created_at", "updated_at"):
            raise ValueError(f"sort_by must be 'created_at' or 'updated_at', not {sort_by!r}")
        col = f"c.{sort_by}"
        where: list[str] = []
        params: list[Any] = []
        if kind is not None:
            where.append("c.kind = ?")
            params.append(kind)
        if agent_id is not None:
            where.append("c.agent_id = ?")
            params.append(agent_id)
        if agent_name is not None:
            # Names are unique, so a scalar subquery: lets the (agent_id, ts, id) index order rows.
            where.append("c.agent_id = (SELECT id FROM agents WHERE name = ?)")
            params.append(agent_name)
        forward = order == "desc"
        for cursor, comes_after in ((after, True), (before, False)):
            if cursor is None:
                continue
            value = self._scalar(f"SELECT {sort_by} FROM conversations WHERE id = ?", [cursor])
            if value is None:
                raise NotFoundError(f"conversation {cursor!r} not found")
            op = "<" if forward == comes_after else ">"
            where.append(f"({col}, c.id) {op} (?, ?)")
            params += [value, cursor]
        # With only `before`, walk away from the cursor then flip back.
        reverse = before is not None and after is None
        direction = "DESC" if forward != reverse else "ASC"
        sql = _CONVERSATION_SELECT
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY {col} {direction}, c.id {direction}"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        rows = self._all(sql, params)
        if reverse:
            rows.reverse()
        return rows

    def update_conversation(self, conv_id: str, **fields: Any) -> dict:
        """Set any of title, reasoning_effort, model_override, workspace."""
        unknown = set(fields) - CONVERSATION_FIELDS
        if unknown:
            raise TypeError(f"cannot update conversation field(s): {', '.join(sorted(unknown))}")
        if fields.get("title", "") is None:
            fields["title"] = ""
        with self._write():
            self._require_conversation(conv_id)
            if fields:
                assignments = ", ".join(f"{name} = ?" for name in fields)
                self.db.execute(
                    f"UPDATE conversations SET {assignments} WHERE id = ?", [*fields.values(), conv_id]
                )
        return self.get_conversation(conv_id)  # type: ignore[return-value]

    def bind_runner(self, conv_id: str, runner_id: str | None, *, expected: str | None | _Any) -> bool:
        """Compare-and-set the conversation's runner: bind only if it is now `expected`.

        `expected=ANY` binds unconditionally. Returns False when the current
        binding differs. `""` means None.
        """
        runner_id = runner_id or None
        with self._write():
            if expected is ANY:
                cur = self.db.execute("UPDATE conversations SET runner_id = ? WHERE id = ?", [runner_id, conv_id])
            else:
                cur = self.db.execute(
                    "UPDATE conversations SET runner_id = ? WHERE id = ? AND runner_id IS ?",
                    [runner_id, conv_id, expected or None],
                )
            if cur.rowcount:
                return True
            self._require_conversation(conv_id)
            return False

    def set_runner(self, conv_id: str, runner_id: str | None) -> None:
        """Bind (or with None, unbind) unconditionally."""
        self.bind_runner(conv_id, runner_id, expected=ANY)

    def rebind_runner(self, old_runner_id: str, new_runner_id: str) -> list[str]:
        """Move every conversation bound to `old_runner_id` to `new_runner_id`, atomically.

        Returns the ids moved (sorted).
        """
        with self._write():
            moved = [
                r[0]
                for r in self.conn.execute(
                    "SELECT id FROM conversations WHERE runner_id = ? ORDER BY id", [old_runner_id]
                )
            ]
            if moved:
                self.db.execute(
                    "UPDATE conversations SET runner_id = ? WHERE runner_id = ?", [new_runner_id, old_runner_id]
                )
        return moved

    def conversations_for_runner(self, runner_id: str) -> list[str]:
        """Ids of the conversations bound to `runner_id`."""
        return [
            r[0] for r in self.conn.execute("SELECT id FROM conversations WHERE runner_id = ? ORDER BY id", [runner_id])
        ]

    # -- items ---------------------------------------------------------------

    def _insert_items(
        self,
        conv_id: str,
        items: list[dict],
        *,
        turn_id: str | None,
        response_id: str | None,
        status: str | None,
        output_indexed: bool,
    ) -> list[dict]:
        # Caller holds the write transaction.
        row = self.conn.execute("SELECT next_position, title FROM conversations WHERE id = ?", [conv_id]).fetchone()
        if row is None:
            raise NotFoundError(f"conversation {conv_id!r} not found")
        position, title = row
        now = self._after("updated_at", self._clock())
        stored = []
        for index, item in enumerate(items):
            wire = _wire_item(item, response_id=response_id, status=status, created_at=now)
            if not title:
                title = derive_title(wire)
                if title:
                    self.db.execute("UPDATE conversations SET title = ? WHERE id = ?", [title, conv_id])
            try:
                self.db.execute(
                    """INSERT INTO conversation_items (id, conversation_id, turn_id, response_id,
                           output_index, position, type, status, role, data, created_at)
                       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                    [
                        wire["id"],
                        conv_id,
                        turn_id,
                        wire["response_id"],
                        index if output_indexed else None,
                        position,
                        wire["type"],
                        wire["status"],
                        wire.get("role"),
                        json.dumps(_stored_data(item, wire)),
                        now,
                    ],
                )
            except sqlite3.IntegrityError as e:
                raise ConflictError(f"item {wire['id']!r} already exists in {conv_id!r}") from e
            position += 1
            stored.append(wire)
        self.db.execute(
            "UPDATE conversations SET next_position = ?, updated_at = ? WHERE id = ?", [position, now, conv_id]
        )
        return stored

    def append_item(
        self,
        conv_id: str,
        item: dict,
        *,
        turn_id: str | None = None,
        response_id: str | None = None,
        status: str | None = None,
    ) -> dict:
        """Append one item at the next position; returns it in wire form.

        The id is the item's own "id" or a new `msg_...`; "type" defaults to
        'message' when the item has a "role". `status` defaults to the item's
        own "status", else 'completed'. Bumps the conversation's
        updated_at, and sets its title from the first user message.
        """
        with self._write():
            return self._insert_items(
                conv_id, [item], turn_id=turn_id, response_id=response_id, status=status, output_indexed=False
            )[0]

    def append_turn_output(self, conv_id: str, turn_id: str, items: list[dict], response_id: str | None) -> bool:
        """Persist a turn's output once: False (and nothing written) if it already was.

        A late or duplicate completion from a dead attempt is thereby ignored.
        """
        with self._write():
            self._require_conversation(conv_id)
            claimed = self.db.execute(
                """INSERT OR IGNORE INTO turn_outputs (turn_id, conversation_id, response_id, item_count, created_at)
                   VALUES (?, ?, ?, ?, ?)""",
                [turn_id, conv_id, response_id, len(items), self._clock()],
            ).rowcount
            if not claimed:
                return False
            if items:
                self._insert_items(
                    conv_id, list(items), turn_id=turn_id, response_id=response_id, status=None, output_indexed=True
                )
        return True

    def list_items(
        self,
        conv_id: str,
        *,
        limit: int | None = None,
        after: str | None = None,
        before: str | None = None,
        order: str = "asc",
    ) -> list[dict]:
        """Items in position order (one query), in wire form.

        `after`/`before` are item ids: only items later/earlier in this order.
        """
        if order not in ("asc", "desc"):
            raise ValueError(f"order must be 'asc' or 'desc', not {order!r}")
        where = ["conversation_id = ?"]
        params: list[Any] = [conv_id]
        for cursor, comes_after in ((after, True), (before, False)):
            if cursor is None:
                continue
            pos = self._scalar(
                "SELECT position FROM conversation_items WHERE conversation_id = ? AND id = ?", [conv_id, cursor]
            )
            if pos is None:
                raise NotFoundError(f"item {cursor!r} not found in {conv_id!r}")
            where.append("position > ?" if (order == "asc") == comes_after else "position < ?")
            params.append(pos)
        sql = f"{_ITEM_SELECT} WHERE {' AND '.join(where)} ORDER BY position {order.upper()}"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        return [_item(r) for r in self.conn.execute(sql, params)]

    def count_items(self, conv_id: str) -> int:
        return self._scalar("SELECT COUNT(*) FROM conversation_items WHERE conversation_id = ?", [conv_id])

    def get_item(self, conv_id: str, item_id: str) -> dict | None:
        row = self.conn.execute(
            f"{_ITEM_SELECT} WHERE conversation_id = ? AND id = ?", [conv_id, item_id]
        ).fetchone()
        return _item(row) if row else None

    # -- turns ---------------------------------------------------------------

    def create_turn(self, conv_id: str, input_item_id: str | None, *, owner_pid: int | None = None) -> dict:
        """A new 'queued' turn. `owner_pid` defaults to this process, so a queued
        turn of a process that died can be found by `interrupt_orphaned_turns`."""
        turn_id = ids.new_id(ids.TURN)
        with self._write():
            self._require_conversation(conv_id)
            self.db.execute(
                """INSERT INTO turns (id, conversation_id, input_item_id, status, owner_pid, created_at)
                   VALUES (?, ?, ?, 'queued', ?, ?)""",
                [turn_id, conv_id, input_item_id, os.getpid() if owner_pid is None else owner_pid, self._clock()],
            )
        return self.get_turn(turn_id)  # type: ignore[return-value]

    def get_turn(self, turn_id: str) -> dict | None:
        return _turn(self._one(_TURN_SELECT + " WHERE t.id = ?", [turn_id]))

    def _require_turn(self, turn_id: str) -> str:
        status = self._scalar("SELECT status FROM turns WHERE id = ?", [turn_id])
        if status is None:
            raise NotFoundError(f"turn {turn_id!r} not found")
        return status

    def list_turns(self, conv_id: str, *, status: str | None = None) -> list[dict]:
        """Turns of a conversation, oldest first."""
        sql = _TURN_SELECT + " WHERE t.conversation_id = ?"
        params: list[Any] = [conv_id]
        if status is not None:
            sql += " AND t.status = ?"
            params.append(status)
        return [_turn(r) for r in self._all(sql + " ORDER BY t.created_at, t.rowid", params)]

    def next_queued_turn(self, conv_id: str) -> dict | None:
        """The oldest 'queued' turn of a conversation."""
        return _turn(
            self._one(
                _TURN_SELECT + " WHERE t.conversation_id = ? AND t.status = 'queued' ORDER BY t.created_at, t.rowid LIMIT 1",
                [conv_id],
            )
        )

    def start_turn(self, turn_id: str, runner_id: str | None, owner_pid: int | None = None) -> dict:
        """Mark a queued, interrupted (or re-dispatched running) turn 'running'; attempt += 1.

        Raises ConflictError if the turn already ended.
        """
        with self._write():
            status = self._require_turn(turn_id)
            if status in TURN_TERMINAL:
                raise ConflictError(f"turn {turn_id!r} is already {status}")
            self.db.execute(
                """UPDATE turns SET status = 'running', attempt = attempt + 1, runner_id = ?,
                       owner_pid = COALESCE(?, owner_pid), error = NULL, started_at = ?, ended_at = NULL
                   WHERE id = ?""",
                [runner_id, owner_pid, self._clock(), turn_id],
            )
        return self.get_turn(turn_id)  # type: ignore[return-value]

    def finish_turn(
        self, turn_id: str, status: str, error: str | None = None, *, attempt: int | None = None
    ) -> dict | None:
        """End a turn as completed, failed, interrupted or cancelled.

        Returns the updated turn, or None if it had already ended (or, with
        `attempt`, if that is no longer the current attempt): a stale report
        never overwrites a newer outcome.
        """
        if status not in TURN_STATUSES - {"queued", "running"}:
            raise ValueError(f"cannot finish a turn as {status!r}")
        with self._write():
            self._require_turn(turn_id)
            sql = f"""UPDATE turns SET status = ?, error = ?, ended_at = ?
                      WHERE id = ? AND status IN ({", ".join("?" * len(TURN_OPEN))})"""
            params: list[Any] = [status, error, self._clock(), turn_id, *TURN_OPEN]
            if attempt is not None:
                sql += " AND attempt = ?"
                params.append(attempt)
            if not self.db.execute(sql, params).rowcount:
                return None
        return self.get_turn(turn_id)

    def mark_interrupted(self, turn_id: str) -> dict | None:
        """queued/running -> 'interrupted'; None if the turn was in another state."""
        with self._write():
            self._require_turn(turn_id)
            changed = self.db.execute(
                "UPDATE turns SET status = 'interrupted', ended_at = ? WHERE id = ? AND status IN ('queued', 'running')",
                [self._clock(), turn_id],
            ).rowcount
        return self.get_turn(turn_id) if changed else None

    def interrupt_runner_turns(self, runner_id: str) -> list[dict]:
        """Every running turn of a lost runner -> 'interrupted'; returns them."""
        with self._write():
            turn_ids = [
                r[0]
                for r in self.conn.execute(
                    "SELECT id FROM turns WHERE runner_id = ? AND status = 'running'", [runner_id]
                )
            ]
            if turn_ids:
                self.db.execute(
                    "UPDATE turns SET status = 'interrupted', ended_at = ? WHERE runner_id = ? AND status = 'running'",
                    [self._clock(), runner_id],
                )
        return [self.get_turn(t) for t in turn_ids]  # type: ignore[misc]

    def interrupt_orphaned_turns(self, alive_pid_check: Callable[[int], bool]) -> list[dict]:
        """Queued or running turns whose owner process is gone -> 'interrupted'.

        The liveness check runs outside the write lock; the update re-checks
        status and owner so a turn taken over meanwhile is left alone.
        """
        candidates = self.conn.execute(
            "SELECT id, owner_pid FROM turns WHERE status IN ('queued', 'running') AND owner_pid IS NOT NULL"
        ).fetchall()
        alive: dict[int, bool] = {}
        dead = []
        for turn_id, pid in candidates:
            if pid not in alive:
                alive[pid] = bool(alive_pid_check(pid))
            if not alive[pid]:
                dead.append((turn_id, pid))
        changed = []
        if dead:
            with self._write():
                now = self._clock()
                for turn_id, pid in dead:
                    if self.db.execute(
                        """UPDATE turns SET status = 'interrupted', ended_at = ?
                           WHERE id = ? AND owner_pid = ? AND status IN ('queued', 'running')""",
                        [now, turn_id, pid],
                    ).rowcount:
                        changed.append(turn_id)
        return [self.get_turn(t) for t in changed]  # type: ignore[misc]

    # -- files ---------------------------------------------------------------

    def create_file(
        self,
        conversation_id: str | None,
        filename: str,
        data: bytes,
        content_type: str | None = "application/octet-stream",
    ) -> dict:
        """Store a file; returns its metadata (no data)."""
        file_id = ids.new_id(ids.FILE)
        with self._write():
            if conversation_id is not None:
                self._require_conversation(conversation_id)
            self.db.execute(
                f"INSERT INTO files ({_FILE_META}, data) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [file_id, conversation_id, filename, len(data), content_type, self._clock(), bytes(data)],
            )
        return self._one(f"SELECT {_FILE_META} FROM files WHERE id = ?", [file_id])  # type: ignore[return-value]

    def get_file(self, file_id: str) -> dict | None:
        """Metadata plus `data` (bytes)."""
        return self._one(f"SELECT {_FILE_META}, data FROM files WHERE id = ?", [file_id])

    def list_files(self, conversation_id: str) -> list[dict]:
        """Metadata (no data) of a conversation's files, oldest first."""
        return self._all(
            f"SELECT {_FILE_META} FROM files WHERE conversation_id = ? ORDER BY created_at, rowid", [conversation_id]
        )

    # -- runner credentials ----------------------------------------------------
    # Only a hash of each runner's secret is kept (the secret lives in the
    # runner's environment), so a copy of the store opens no runner route.

    def add_runner_credential(self, runner_id: str, secret_hash: str, *, kind: str,
                              host_id: str | None = None) -> bool:
        """Bind a secret hash to a new runner id; False (nothing changed) if the id is known."""
        if kind not in ("host", "explicit"):
            raise ValueError(f"credential kind must be 'host' or 'explicit', not {kind!r}")
        with self._write():
            return self.db.execute(
                "INSERT OR IGNORE INTO runner_credentials (runner_id, secret_hash, kind, host_id, created_at)"
                " VALUES (?, ?, ?, ?, ?)", [runner_id, secret_hash, kind, host_id, self._clock()],
            ).rowcount == 1

    def runner_credential(self, runner_id: str) -> dict | None:
        """The credential row of a runner id (revoked ones too: `revoked_at` is set)."""
        return self._one("SELECT runner_id, secret_hash, kind, host_id, created_at, revoked_at"
                         " FROM runner_credentials WHERE runner_id = ?", [runner_id])

    def revoke_runner_credential(self, runner_id: str) -> None:
        """That runner process is gone: its secret opens nothing any more."""
        with self._write():
            self.db.execute("UPDATE runner_credentials SET revoked_at = ? WHERE runner_id = ?"
                            " AND revoked_at IS NULL", [self._clock(), runner_id])

    def prune_runner_credentials(self, older_than: float) -> int:
        """Forget credentials revoked more than `older_than` seconds ago; returns how many."""
        with self._write():
            return self.db.execute("DELETE FROM runner_credentials WHERE revoked_at < ?",
                                   [self._clock() - older_than]).rowcount
    # -- conversation claims (one turn at a time, across processes) ----------

    def claim_conversation(self, conv_id: str, owner: ClaimOwner, *, turn_id: str | None, lease: float) -> bool:
        """Take (or renew) the conversation's claim for `owner`, for `lease` seconds.

        Succeeds when the conversation is unclaimed, already `owner`'s, or its
        holder is dead (pid gone or reused) or let its lease expire.
        """
        with self._write():
            self._require_conversation(conv_id)
            now = self._clock()
            row = self.conn.execute(
                "SELECT owner_pid, owner_started, owner_token, lease_until FROM conversation_claims"
                " WHERE conversation_id = ?", [conv_id]).fetchone()
            if row is not None and not _same_owner(row, owner) and row[3] > now and owner_alive(row[0], row[1]):
                return False
            self.db.execute(
                """INSERT OR REPLACE INTO conversation_claims (conversation_id, turn_id, owner_pid,
                       owner_started, owner_token, lease_until, claimed_at) VALUES (?, ?, ?, ?, ?, ?, ?)""",
                [conv_id, turn_id, owner.pid, owner.started, owner.token, now + lease, now],
            )
        return True

    def renew_claim(self, conv_id: str, owner: ClaimOwner, *, lease: float) -> bool:
        """Extend `owner`'s claim; False if it no longer holds it (taken over)."""
        with self._write():
            return bool(self.db.execute(
                """UPDATE conversation_claims SET lease_until = ? WHERE conversation_id = ?
                   AND owner_pid = ? AND owner_started = ? AND owner_token = ?""",
                [self._clock() + lease, conv_id, owner.pid, owner.started, owner.token],
            ).rowcount)

    def release_claim(self, conv_id: str, owner: ClaimOwner) -> bool:
        with self._write():
            return bool(self.db.execute(
                """DELETE FROM conversation_claims WHERE conversation_id = ?
                   AND owner_pid = ? AND owner_started = ? AND owner_token = ?""",
                [conv_id, owner.pid, owner.started, owner.token],
            ).rowcount)

    def claim_of(self, conv_id: str) -> dict | None:
        """The claim row of a conversation with `live` (holder alive, lease running), or None."""
        row = self._one("SELECT * FROM conversation_claims WHERE conversation_id = ?", [conv_id])
        if row is not None:
            row["live"] = row["lease_until"] > self._clock() and owner_alive(row["owner_pid"], row["owner_started"])
        return row

    def claimed_elsewhere(self, conv_id: str, owner: ClaimOwner) -> bool:
        """Another live claimant holds this conversation now (so leave its binding alone)."""
        row = self.claim_of(conv_id)
        return bool(row and row["live"] and not _same_owner(
            (row["owner_pid"], row["owner_started"], row["owner_token"]), owner))

    def queue_message(self, conv_id: str, item: dict) -> tuple[dict, dict]:
        """A user message and its queued turn; returns (item in wire form, turn).

        While the conversation is busy (a turn queued or running, or a claim
        on it) the item waits in `pending_items` and joins the conversation
        when its turn holds the claim (`place_pending`): it then comes after
        the answer it waited for. Otherwise it is appended at once.
        """
        with self._write():
            self._require_conversation(conv_id)
            busy = self._scalar(
                """SELECT EXISTS (SELECT 1 FROM turns WHERE conversation_id = ? AND status IN ('queued', 'running'))
                       OR EXISTS (SELECT 1 FROM conversation_claims WHERE conversation_id = ?)""",
                [conv_id, conv_id])
            if busy:
                now = self._clock()
                wire = _wire_item(item, response_id=None, status=None, created_at=now)
                self.db.execute(
                    "INSERT INTO pending_items (conversation_id, id, data, created_at) VALUES (?, ?, ?, ?)",
                    [conv_id, wire["id"], json.dumps(item | {"id": wire["id"]}), now])
            else:
                wire = self._insert_items(conv_id, [item], turn_id=None, response_id=None, status=None,
                                          output_indexed=False)[0]
            turn_id = ids.new_id(ids.TURN)
            self.db.execute(
                """INSERT INTO turns (id, conversation_id, input_item_id, status, owner_pid, created_at)
                   VALUES (?, ?, ?, 'queued', ?, ?)""",
                [turn_id, conv_id, wire["id"], os.getpid(), self._clock()],
            )
        return wire, self.get_turn(turn_id)  # type: ignore[return-value]

    def place_pending(self, conv_id: str, item_id: str | None) -> dict | None:
        """Append a pending item at the conversation's end; None if it is not pending."""
        if item_id is None:
            return None
        with self._write():
            row = self.conn.execute(
                "SELECT data FROM pending_items WHERE conversation_id = ? AND id = ?", [conv_id, item_id]).fetchone()
            if row is None:
                return None
            self.db.execute("DELETE FROM pending_items WHERE conversation_id = ? AND id = ?", [conv_id, item_id])
            if self._scalar("SELECT 1 FROM conversation_items WHERE conversation_id = ? AND id = ?",
                            [conv_id, item_id]):
                return None
            return self._insert_items(conv_id, [json.loads(row[0])], turn_id=None, response_id=None,
                                      status=None, output_indexed=False)[0]

    def next_own_queued_turn(self, conv_id: str, owner_pid: int) -> dict | None:
        """The oldest 'queued' turn of a conversation that the process `owner_pid` posted.

        Each process runs only its own turns: another live process's queued
        turn is its to run (and its client waits for it there).
        """
        return _turn(
            self._one(
                _TURN_SELECT + """ WHERE t.conversation_id = ? AND t.status = 'queued' AND t.owner_pid = ?
                                   ORDER BY t.created_at, t.rowid LIMIT 1""",
                [conv_id, owner_pid],
            )
        )

    def runner_loads(self, runner_ids: Iterable[str]) -> dict[str, int]:
        """How many conversations are bound to each of `runner_ids` (0 for none)."""
        runner_ids = list(runner_ids)
        loads = dict.fromkeys(runner_ids, 0)
        if runner_ids:
            marks = ", ".join("?" * len(runner_ids))
            for runner_id, count in self.conn.execute(
                f"SELECT runner_id, COUNT(*) FROM conversations WHERE runner_id IN ({marks}) GROUP BY runner_id",
                runner_ids,
            ):
                loads[runner_id] = count
        return loads


def _same_owner(row: tuple, owner: ClaimOwner) -> bool:
    return (row[0], row[1], row[2]) == (owner.pid, owner.started, owner.token)


def _agent(row: dict | None) -> dict | None:
    if row is not None:
        row["spec"] = json.loads(row["spec"]) if row["spec"] else {}
    return row


def _turn(row: dict | None) -> dict | None:
    if row is not None:
        row["output_persisted"] = bool(row["output_persisted"])
    return row


def _wire_item(item: dict, *, response_id: str | None, status: str | None, created_at: float) -> dict:
    """The item as the API lists it: the item itself plus omnigent's fields (id, status, response_id, created_at)."""
    if not isinstance(item, dict):
        raise TypeError(f"an item must be a dict, not {type(item).__name__}")
    item_type = item.get("type") or ("message" if "role" in item else None)
    if not isinstance(item_type, str):
        raise ValueError("an item needs a 'type'")
    status = status or item.get("status") or "completed"
    if status not in ITEM_STATUSES:
        raise ValueError(f"item status must be one of {sorted(ITEM_STATUSES)}, not {status!r}")
    wire = {"id": item.get("id") or ids.new_id(ids.MESSAGE), "type": item_type}
    wire.update((k, v) for k, v in item.items() if k not in ("id", "type"))
    wire["status"] = status
    wire["response_id"] = response_id or item.get("response_id")
    wire["created_at"] = created_at
    return wire


def _stored_data(item: dict, wire: dict) -> dict:
    # The JSON copy is the item as its author (the endpoint, the client) sent it, with its id
    # (the endpoint's, else omnigent's): omnigent's own fields live in their columns only, so
    # what goes back to a model is what came from it (server/history.py).
    return {"id": wire["id"], "type": wire["type"],
            **{k: v for k, v in item.items() if k not in ("id", "type", "response_id", "created_at")}}


def _item(row: tuple) -> dict:
    # Columns are authoritative over the JSON copy (which, before 0.2, also held them).
    item_id, item_type, status, response_id, created_at, data = row
    wire = json.loads(data)
    wire.update(id=item_id, type=item_type, status=status, response_id=response_id, created_at=created_at)
    return wire


__all__ = [
    "ANY",
    "CONVERSATION_FIELDS",
    "ITEM_STATUSES",
    "KIND_DEFAULT",
    "KIND_SUB_AGENT",
    "TURN_STATUSES",
    "ConflictError",
    "NotFoundError",
    "Store",
    "StoreError",
    "derive_title",
]
