"""What every part of the store shares: the connection helpers, the row shapes, the constants.

Private to `omnigent.store`. `Tables` is the base of each table mixin (see
`store.py`): it owns nothing but `db`, `conn` and the clock, which `Store`
sets, and gives them one way to read (`_one`, `_all`, `_scalar`) and one
way to write (`_write`, an IMMEDIATE transaction). The row helpers turn
sqlite rows into the plain dicts every `Store` method returns, so the
wire form of an item (`_wire_item`, `_item`) is defined once.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from . import ids
from .db import write_transaction
from .errors import NotFoundError

if TYPE_CHECKING:
    import sqlite_utils  # imported when a store is opened (see db.py)

KIND_DEFAULT = 1
KIND_SUB_AGENT = 2

# interrupted / cancelled / not_run (0008): a tool call's output when its tool was cut short or never ran
ITEM_STATUSES = frozenset({"completed", "in_progress", "incomplete", "failed", "interrupted", "cancelled", "not_run"})
# waiting (0008): a running turn whose loop waits for an approval
TURN_STATUSES = frozenset({"queued", "running", "waiting", "completed", "failed", "interrupted", "cancelled"})
TURN_TERMINAL = frozenset({"completed", "failed", "cancelled"})
# A turn in one of these can still be (re)started, finished or interrupted.
TURN_OPEN = ("queued", "running", "waiting", "interrupted")

TITLE_MAX = 60
CONVERSATION_FIELDS = frozenset({"title", "reasoning_effort", "model_override", "workspace", "permission_mode"})
# a session's own permission mode (0007); NULL: its agent spec's
PERMISSION_MODES = ("ask", "auto", "deny")

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


class Tables:
    """The connection and its helpers, shared by every table mixin of `Store`."""

    path: str | Path
    db: sqlite_utils.Database
    conn: sqlite3.Connection
    _clock: Callable[[], float]

    def _write(self) -> contextlib.AbstractContextManager[None]:
        return write_transaction(self.conn)

    def _write_one(self) -> contextlib.AbstractContextManager[None]:
        """`_write` for a write of one statement: inside an open transaction it needs no savepoint
        (SQLite undoes a failed statement by itself), so it joins as it is."""
        return write_transaction(self.conn)

    # Reads go straight to the connection: sqlite-utils' `query` wraps each one in a
    # SAVEPOINT/RELEASE pair (for writes with RETURNING, which the store never reads
    # through these), three statements where one does. A turn makes ~25 reads.
    def _one(self, sql: str, params: Iterable[Any] = ()) -> dict | None:
        cursor = self.conn.execute(sql, list(params))
        row = cursor.fetchone()
        return None if row is None else dict(zip(_keys(cursor), row))

    def _all(self, sql: str, params: Iterable[Any] = ()) -> list[dict]:
        cursor = self.conn.execute(sql, list(params))
        keys = _keys(cursor)
        return [dict(zip(keys, row)) for row in cursor]

    def _written(self, sql: str, params: Iterable[Any] = ()) -> dict | None:
        """The one row a write's RETURNING clause gives (None: nothing written), read to the end so
        that the statement is done: the write and the read back of a hot path in one statement."""
        cursor = self.conn.execute(sql, list(params))
        rows = cursor.fetchall()
        return dict(zip(_keys(cursor), rows[0])) if rows else None

    def _scalar(self, sql: str, params: Iterable[Any] = ()) -> Any:
        row = self.conn.execute(sql, list(params)).fetchone()
        return row[0] if row else None

    def _after(self, column: str, now: float) -> float:
        # Strictly after every existing value: "newest" stays unambiguous even
        # for two writes within the clock's resolution or a clock step back.
        return strictly_after(self._scalar(f"SELECT MAX({column}) FROM conversations"), now)

    def _require_conversation(self, conv_id: str) -> None:
        if self._scalar("SELECT 1 FROM conversations WHERE id = ?", [conv_id]) is None:
            raise NotFoundError(f"conversation {conv_id!r} not found")


# Ids bound into one `IN (...)` at most: SQLite refuses a statement with more parameters than
# its build allows (32,766 by default, 999 before 3.32), and a process may hold more claims (or
# ask about more turns) than that.
IN_CHUNK = 500


def in_chunks(values: Iterable[str], size: int = IN_CHUNK) -> Iterator[list[str]]:
    """`values` in lists of at most `size`, each small enough to bind into one `IN (...)`."""
    chunk: list[str] = []
    for value in values:
        chunk.append(value)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def strictly_after(latest: float | None, now: float) -> float:
    """`now`, or just after `latest` (the newest stored value) when `now` is not after it (`Tables._after`)."""
    return now if latest is None or now > latest else latest + _TICK


def _keys(cursor: sqlite3.Cursor) -> list[str]:
    return [column[0] for column in cursor.description]


def _agent(row: dict | None) -> dict | None:
    if row is not None:
        row["spec"] = json.loads(row["spec"]) if row["spec"] else {}
    return row


def _turn(row: dict | None, step: dict | None = None) -> dict | None:
    if row is not None:
        row["output_persisted"] = bool(row["output_persisted"])
        row["usage"] = json.loads(row["usage"]) if row.get("usage") else None
        row.pop("last_step", None)
        row["step"] = step
    return row


Row = TypeVar("Row", bound="dict | None")  # a row decoder keeps a found row a dict for mypy


def _step(row: Row) -> Row:
    if row is not None:
        row["usage"] = json.loads(row["usage"]) if row.get("usage") else None
    return row


# the columns of a step row, in the order `steps()` returns them
STEP_COLUMNS = ("turn_id", "step", "kind", "status", "call_id", "tool", "arguments", "attempt", "usage",
                "error", "started_at", "ended_at")


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
