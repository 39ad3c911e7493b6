"""The `conversation_items` table: a conversation's items in position order, and turn outputs.

Guarantees: positions are dense and never reused; a turn's output is
stored at most once (`append_turn_output` claims `turn_outputs` first, so
a late or duplicate completion writes nothing); an item comes back in
wire form, its columns authoritative over its JSON copy; the first user
message titles an untitled conversation.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from ._base import Tables, _item, _stored_data, _wire_item, derive_title, strictly_after
from .errors import ConflictError, NotFoundError

_ITEM_SELECT = "SELECT id, type, status, response_id, created_at, data FROM conversation_items"
# What an insert of items needs of its conversation's row: where they go, whether it has a title,
# and the newest updated_at of all (an index seek, `Tables._after`) in the same statement
HEAD_COLUMNS = "next_position, title, (SELECT MAX(updated_at) FROM conversations)"


class ItemsMixin(Tables):
    def _insert_items(
        self,
        conv_id: str,
        items: list[dict],
        *,
        turn_id: str | None,
        response_id: str | None,
        status: str | None,
        output_indexed: bool,
        first_index: int = 0,
        head: tuple[Any, ...] | None = None,
    ) -> list[dict]:
        # Caller holds the write transaction. `first_index`: a turn's later steps continue
        # the output slots of its earlier ones (store/steps.py). `head`: `HEAD_COLUMNS` of the
        # conversation's row, read by the caller in this transaction (None: read here).
        if head is None:
            head = self.conn.execute(f"SELECT {HEAD_COLUMNS} FROM conversations WHERE id = ?", [conv_id]).fetchone()
            if head is None:
                raise NotFoundError(f"conversation {conv_id!r} not found")
        position, title, latest = head[:3]
        now = strictly_after(latest, self._clock())
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
                        first_index + index if output_indexed else None,
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

    def _next_output_index(self, conv_id: str, turn_id: str) -> int:
        # the turn's next output slot: after the items of its earlier steps (store/steps.py)
        return self._scalar(
            "SELECT COALESCE(MAX(output_index) + 1, 0) FROM conversation_items WHERE conversation_id = ? "
            "AND turn_id = ? AND output_index IS NOT NULL", [conv_id, turn_id])  # the index's own condition

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
        The items take the turn's output slots after those its steps stored.
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
                    conv_id, list(items), turn_id=turn_id, response_id=response_id, status=None, output_indexed=True,
                    first_index=self._next_output_index(conv_id, turn_id),
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

    def list_turn_items(self, conv_id: str, turn_id: str) -> list[dict]:
        """The items a turn's steps stored (its output), in position order, in wire form.

        Read from the turn's message on (its items come after it) along the position index, so the
        cost is the turn's, not the conversation's: the agent loop asks on every step."""
        start = self._scalar(  # (a scalar subquery in the range would not seek: it scans)
            "SELECT i.position FROM turns t JOIN conversation_items i"
            " ON i.conversation_id = t.conversation_id AND i.id = t.input_item_id WHERE t.id = ?", [turn_id])
        return [_item(r) for r in self.conn.execute(
            f"{_ITEM_SELECT} WHERE conversation_id = ? AND turn_id = ? AND position >= ? ORDER BY position",
            [conv_id, turn_id, start or 0])]

    def count_items(self, conv_id: str) -> int:
        return self._scalar("SELECT COUNT(*) FROM conversation_items WHERE conversation_id = ?", [conv_id])

    def get_item(self, conv_id: str, item_id: str) -> dict | None:
        row = self.conn.execute(
            f"{_ITEM_SELECT} WHERE conversation_id = ? AND id = ?", [conv_id, item_id]
        ).fetchone()
        return _item(row) if row else None
