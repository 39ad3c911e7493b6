"""The `session_events` table: every event a session's watchers see, numbered per session.

Guarantees:
- Sequence numbers are allocated here, inside a `BEGIN IMMEDIATE`, as
  one more than the highest the file holds for that session: they are
  unique and increasing per session across restarts and across every
  process that shares the file (`store/claims.py`), never only in memory.
- An event can be part of the transaction of the state change it reports:
  inside `event_transaction()` the other store methods' writes join the
  same transaction (as savepoints), so `hub.transaction()` commits the
  change and its event together or neither.
- Compaction removes only text deltas, only of ended turns with at least
  `keep_turns` newer turns, and raises the session's *floor* past them: a
  cursor below the floor is answered with a snapshot (`event_snapshot`),
  never with a log that has holes.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

from ..config.timeline import stall, stalls_enabled
from ._base import TURN_OPEN, TURN_TERMINAL, Tables
from .db import write_transaction

DELTA = "response.output_text.delta"
# events that end a turn: the moment to compact older turns' deltas
_TURN_ENDS = ("response.completed", "response.failed", "response.cancelled")
# an ended turn's deltas may go once it is old enough (the same set, as an SQL list)
_ENDED_SQL = "(" + ", ".join(f"'{status}'" for status in sorted(TURN_TERMINAL)) + ")"
_OPEN_SQL = "(" + ", ".join(f"'{status}'" for status in TURN_OPEN) + ")"
# how many more turns past the window a turn's end looks at than it must (`_compact_recent_locked`)
_SWEEP = 2


_TIMED: bool | None = None  # OMNIGENT_STALLS is set: event transactions are timed (looked up once)


def _time_commits() -> None:
    global _TIMED
    _TIMED = stalls_enabled()


class EventsMixin(Tables):
    _event_tx: bool = False  # inside event_transaction(): other writes join it
    # the last number given to each session inside the open event transaction: it holds the write
    # lock, so no other process numbers one meanwhile (cleared when the transaction ends; a nested
    # savepoint rolled back under it can leave a gap in the numbers at worst, never a duplicate)
    _tx_seqs: dict[str, int] | None = None

    # --- transactions ----------------------------------------------------------

    def _write(self) -> contextlib.AbstractContextManager[None]:
        if self._event_tx:
            return _savepoint(self.conn)
        return write_transaction(self.conn)

    def _write_one(self) -> contextlib.AbstractContextManager[None]:
        # one statement is atomic by itself: a SAVEPOINT/RELEASE pair around it bought nothing
        if self._event_tx:
            return contextlib.nullcontext()
        return write_transaction(self.conn)

    @contextlib.contextmanager
    def event_transaction(self) -> Iterator[None]:
        """One `BEGIN IMMEDIATE` that every store write inside it joins (nested: a savepoint)."""
        if self._event_tx:
            with _savepoint(self.conn):
                yield
            return
        if _TIMED is None:
            _time_commits()
        if _TIMED:
            started = time.perf_counter()
        with write_transaction(self.conn):
            self._event_tx = True
            self._tx_seqs = {}
            try:
                yield
            finally:
                self._event_tx = False
                self._tx_seqs = None
        if _TIMED:  # the write lock's wait, the writes and the COMMIT (and a WAL checkpoint it ran)
            stall("commit", time.perf_counter() - started)

    # --- writing ---------------------------------------------------------------

    def append_events(self, conv_id: str, events: list[dict[str, Any]], *, at_least: int = 0,
                      keep_turns: int | None = None) -> list[str]:
        """Number and store `events` (dicts, updated in place with `sequence_number`).

        Must run inside `event_transaction()` (or opens its own). `at_least`
        is the caller's last known number (an event kept only in memory when
        the disk failed must not be numbered twice). An event that ends a
        turn compacts older turns' deltas when `keep_turns` is given.

        Returns the JSON text stored for each event, in order: the hub sends
        watchers that same text rather than encoding each event again.
        """
        if not self._event_tx:
            with self.event_transaction():
                return self.append_events(conv_id, events, at_least=at_least, keep_turns=keep_turns)
        known = self._tx_seqs.get(conv_id) if self._tx_seqs is not None else None
        seq = max(self._last_seq_locked(conv_id) if known is None else known, at_least)
        now = self._clock()
        rows, texts = [], []
        for event in events:
            seq += 1
            event["sequence_number"] = seq
            turn_id = event.get("turn_id")
            text = json.dumps(event)
            texts.append(text)
            rows.append((conv_id, seq, event["type"], text, now, turn_id if isinstance(turn_id, str) else None))
        self.conn.executemany(
            "INSERT INTO session_events (conversation_id, seq, type, data, created_at, turn_id) "
            "VALUES (?, ?, ?, ?, ?, ?)", rows)
        if self._tx_seqs is not None:
            self._tx_seqs[conv_id] = seq
        if keep_turns is not None:
            ending = {e["turn_id"] for e in events if e["type"] in _TURN_ENDS and isinstance(e.get("turn_id"), str)}
            if ending:
                self._compact_recent_locked(conv_id, keep_turns, ending)
        return texts

    def compact_events(self, conv_id: str, keep_turns: int) -> int:
        """Drop the deltas of every ended turn with `keep_turns` newer turns; returns how many went.

        A full pass over the session's turns (O(turns)); a turn's end compacts
        only the turns it pushed out of the window (`_compact_recent_locked`)."""
        with self.event_transaction():
            old = [r[0] for r in self.conn.execute(
                f"""SELECT id FROM turns WHERE conversation_id = ? AND status IN {_ENDED_SQL}
                     AND id NOT IN (SELECT id FROM turns WHERE conversation_id = ?
                                    ORDER BY created_at DESC, rowid DESC LIMIT ?)""",
                [conv_id, conv_id, max(0, keep_turns)])]
            return self._drop_deltas_locked(conv_id, old)

    def _compact_recent_locked(self, conv_id: str, keep_turns: int, ending: set[str]) -> int:
        """At the end of the turns `ending`: drop the deltas of the ended turns now past the window.

        Flat in the session's length (the full pass over every turn is
        `compact_events`). Every turn's end compacts what is past the window
        of the newest `keep_turns` by then, so what can still hold deltas is:
        - a turn of `ending` itself, when it ends already past the window
          (turns queued behind it, or a retry of an old turn): compacted now;
        - a turn that ended inside the window and was pushed out since the
          last turn's end by newer turns. Those newer turns are still open
          (queued, running, waiting) or are `ending`, so the sweep looks past
          the window by as many turns as that, plus `_SWEEP` to spare (turns
          that ended without a turn-end event).

        Only the turns past the window are read (SQLite skips the window in
        the index): a session of at most `keep_turns` turns costs one empty
        read. Reading the window's rows too cost ~75 µs a turn's end.
        """
        keep = max(0, keep_turns)
        look = len(ending) + _SWEEP
        past = self._turns_past(conv_id, keep, look)
        if len(past) == look:  # more may have been pushed out: by as many turns as are open
            opened = self._scalar(f"SELECT COUNT(*) FROM turns WHERE conversation_id = ? AND status IN {_OPEN_SQL}",
                                  [conv_id])
            if opened:
                past = self._turns_past(conv_id, keep, look + opened)
        if not past:
            return 0  # at most `keep` turns: every one is inside the window
        old = [turn_id for turn_id, status in past if status in TURN_TERMINAL]
        looked = {turn_id for turn_id, _ in past}
        stray = [turn_id for turn_id in ending if turn_id not in looked]
        if stray:  # those older than the newest turn past the window ended past the look
            marks = ", ".join("?" * len(stray))
            old += [r[0] for r in self.conn.execute(
                f"""SELECT t.id FROM turns t, turns p WHERE p.id = ? AND t.id IN ({marks})
                    AND t.status IN {_ENDED_SQL} AND (t.created_at, t.rowid) < (p.created_at, p.rowid)""",
                [past[0][0], *stray])]
        return self._drop_deltas_locked(conv_id, old)

    def _turns_past(self, conv_id: str, keep: int, limit: int) -> list[tuple[str, str]]:
        """The session's turns past the newest `keep`, newest first, at most `limit`: (id, status)."""
        return self.conn.execute(
            """SELECT id, status FROM turns WHERE conversation_id = ?
               ORDER BY created_at DESC, rowid DESC LIMIT ? OFFSET ?""", [conv_id, limit, keep]).fetchall()

    def _drop_deltas_locked(self, conv_id: str, turn_ids: list[str]) -> int:
        """Delete the deltas of `turn_ids` and raise the session's floor past them; returns how many went."""
        if not turn_ids:
            return 0
        marks = ", ".join("?" * len(turn_ids))
        where = f"conversation_id = ? AND type = ? AND turn_id IN ({marks})"
        params = [conv_id, DELTA, *turn_ids]
        # MAX(+seq), not MAX(seq): the unary plus keeps SQLite from answering the MAX by walking
        # the (conversation_id, seq) key down from the newest event, which reads the session's
        # whole log when these turns have no deltas left (200 us at 700 events, O(events) per
        # turn's end); this way it looks only at these turns' rows (idx_session_events_turn)
        top = self._scalar(f"SELECT MAX(+seq) FROM session_events WHERE {where}", params)
        if top is None:
            return 0
        gone = self.conn.execute(f"DELETE FROM session_events WHERE {where}", params).rowcount
        self.conn.execute(
            """INSERT INTO session_event_floors (conversation_id, floor) VALUES (?, ?)
               ON CONFLICT (conversation_id) DO UPDATE SET floor = MAX(floor, excluded.floor)""",
            [conv_id, top])
        return gone

    # --- reading ---------------------------------------------------------------

    def _last_seq_locked(self, conv_id: str) -> int:
        return self._scalar("SELECT MAX(seq) FROM session_events WHERE conversation_id = ?", [conv_id]) or 0

    def last_event_seq(self, conv_id: str) -> int:
        """The newest sequence number of the session (0 before its first event)."""
        return self._last_seq_locked(conv_id)

    def event_floor(self, conv_id: str) -> int:
        """The lowest cursor whose every later event is still stored (0: all of them)."""
        return self._scalar("SELECT floor FROM session_event_floors WHERE conversation_id = ?", [conv_id]) or 0

    def read_events(self, conv_id: str, after: int, *, before: int | None = None,
                    limit: int = 500) -> list[dict[str, Any]]:
        """Stored events with after < seq (< before), oldest first, at most `limit`."""
        sql = "SELECT data, seq FROM session_events WHERE conversation_id = ? AND seq > ?"
        params: list[Any] = [conv_id, after]
        if before is not None:
            sql += " AND seq < ?"
            params.append(before)
        rows = self.conn.execute(sql + " ORDER BY seq LIMIT ?", [*params, limit]).fetchall()
        out = []
        for data, seq in rows:
            event = json.loads(data)
            event["sequence_number"] = seq  # the column is authoritative
            out.append(event)
        return out

    def event_snapshot(self, conv_id: str) -> dict[str, Any]:
        """The session as of one sequence number, read in one transaction (for `resync`).

        `sequence_number` is the newest event the snapshot includes: a watcher
        that applies it goes on with the events after that number.
        """
        with self._read():
            seq = self._last_seq_locked(conv_id)
            conv = self.get_conversation(conv_id)  # type: ignore[attr-defined]
            items = self.list_items(conv_id) if conv else []  # type: ignore[attr-defined]
            turns = [_turn_state(t) for t in self.list_turns(conv_id)] if conv else []  # type: ignore[attr-defined]
        return {"sequence_number": seq, "session": conv, "items": items, "turns": turns}

    @contextlib.contextmanager
    def _read(self) -> Iterator[None]:
        # a deferred transaction: one WAL snapshot for several queries (none inside a write)
        if self.conn.in_transaction:
            yield
            return
        self.conn.execute("BEGIN")
        try:
            yield
        finally:
            if self.conn.in_transaction:
                self.conn.execute("COMMIT")


def _turn_state(turn: dict) -> dict[str, Any]:
    keep = ("id", "status", "attempt", "error", "runner_id", "created_at", "started_at", "ended_at", "usage", "step")
    return {k: turn.get(k) for k in keep}


@contextlib.contextmanager
def _savepoint(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("SAVEPOINT omnigent_nested")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK TO omnigent_nested")
        conn.execute("RELEASE omnigent_nested")
        raise
    conn.execute("RELEASE omnigent_nested")

