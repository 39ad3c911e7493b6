"""The reading side of the event hub: followers of a session's log, from any cursor.

`EventHub` is built from this mixin and its own writing side; callers only
ever see `hub.follow`, `hub.follow_batches` and `hub.resync`. It reads the
hub's memory logs (`memory_log.py`) and its store, and writes nothing.

What it guarantees:
- A follower gets every event numbered above its cursor, in order, then the
  live ones: recent events from the bounded memory log, older ones (and the
  holes another process's events leave in it) from the store, a page of
  `_PAGE` at a time.
- It waits on the session's trio.Event, so a slow client costs no buffer and
  never blocks the server; while the session's turn is being dispatched
  (`EventHub.hold`) it waits for that too, `HOLD_MAX` at most.
- A cursor the log cannot serve whole (before the log existed, compacted, or
  above the newest number) gets one `session.resync` with a snapshot first:
  never silence, never a hole.
- A store that fails to read is logged; the follower goes on with what memory
  holds.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections import deque
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

import trio

from protocol import events

from .memory_log import _Log

if TYPE_CHECKING:
    from ..store import Store

log = logging.getLogger("omnigent.server.hub")  # the hub's: its records keep the name they had

_PAGE = 500             # events per store read while replaying


class FollowingMixin:
    """`follow`, `follow_batches` and `resync` of `EventHub`, over its memory logs and store."""

    store: Store | None
    _closed: trio.Event  # set by EventHub.close(): every follower ends

    if TYPE_CHECKING:  # EventHub's own
        def _log(self, session_id: str) -> _Log: ...
        def _refresh(self, session_id: str, log_: _Log) -> None: ...

    async def dispatched(self, session_id: str) -> None:
        """Wait while the session's followers are held back (`EventHub.hold`): until its turn's
        dispatch is done or waits, `HOLD_MAX` at most. At once when nothing holds them.

        For the post that queued the turn: its HTTP answer is written after the TurnStart, not
        interleaved with it (~0.3 ms of CPU on one event loop), as the watchers' writes are."""
        log_ = self._log(session_id)
        if log_.hold is not None:
            await _held_back(log_)

    async def follow(self, session_id: str, after: int | None = None, *,
                     heartbeat: float | None = None) -> AsyncGenerator[dict[str, Any], None]:
        """Events with sequence_number > after, then live ones; None = live only.

        A cursor the log cannot serve whole gets one `session.resync` first.
        With `heartbeat`, a `session.heartbeat` (no number, never stored) is
        yielded after that many seconds without an event.
        """
        batches = self.follow_batches(session_id, after, heartbeat=heartbeat)
        async with contextlib.aclosing(batches):
            async for batch in batches:
                for event in batch:
                    yield event

    async def follow_batches(self, session_id: str, after: int | None = None, *,
                             heartbeat: float | None = None) -> AsyncGenerator[list[dict[str, Any]], None]:
        """`follow`, a list at a time: every event ready when the follower looks.

        A stream route writes each list as one chunk, so a burst of deltas
        costs one write per watcher, not one per delta.
        """
        log_ = self._log(session_id)
        self._refresh(session_id, log_)
        cursor = log_.last_seq if after is None else after
        reason = self._resync_reason(session_id, cursor, log_)
        if reason is not None:
            resync = self.resync(session_id, cursor, reason)
            cursor = resync["sequence_number"]
            yield [resync]
        while not self._closed.is_set() and not log_.ended:
            if log_.hold is not None:  # the session's turn is being dispatched (EventHub.hold)
                await _held_back(log_)
            changed = log_.changed
            batch = [e for e in self._next(session_id, log_, cursor) if e["sequence_number"] > cursor]
            if batch:
                cursor = batch[-1]["sequence_number"]
                yield batch
                continue
            if heartbeat is None:
                await changed.wait()
                continue
            with trio.move_on_after(heartbeat) as idle:
                await changed.wait()
            if idle.cancelled_caught:
                yield [{"type": events.HEARTBEAT, "session_id": session_id}]

    def _resync_reason(self, session_id: str, cursor: int, log_: _Log) -> str | None:
        if cursor > log_.last_seq:
            return "ahead"  # a cursor from another store, or one that was reset
        if self.store is None:
            return None
        try:
            floor = self.store.event_floor(session_id)
        except sqlite3.Error:
            return None
        if cursor < floor:
            return "before_log" if floor == 1 and cursor == 0 else "compacted"
        return None

    def resync(self, session_id: str, cursor: int, reason: str) -> dict[str, Any]:
        """The snapshot event for a watcher whose cursor the log cannot serve."""
        snap: dict[str, Any] = {"sequence_number": self._log(session_id).last_seq,
                                "session": None, "items": [], "turns": []}
        if self.store is not None:
            try:
                snap = self.store.event_snapshot(session_id)
            except sqlite3.Error as exc:
                log.error("cannot read a snapshot of %s: %s", session_id, exc)
        event = events.make_event(events.RESYNC, reason=reason, after=cursor, session=snap["session"],
                                  items=snap["items"], turns=snap["turns"])
        event["session_id"] = session_id
        event["sequence_number"] = max(snap["sequence_number"], 0)
        return event

    def _next(self, session_id: str, log_: _Log, cursor: int) -> list[dict[str, Any]]:
        """The next events after `cursor`: from memory when it holds them, else from the store."""
        if cursor >= log_.last_seq:
            return []
        entries = log_.entries
        index = _index_after(entries, cursor)
        if index is not None and entries[index]["sequence_number"] == cursor + 1:
            run = []
            expected = cursor + 1
            for n in range(index, min(len(entries), index + _PAGE)):
                event = entries[n]
                if event["sequence_number"] != expected:
                    break  # a hole: another process's events, read from the store next
                run.append(event)
                expected += 1
            return run
        if self.store is not None:
            before = entries[index]["sequence_number"] if index is not None else None
            try:
                stored = self.store.read_events(session_id, cursor, before=before, limit=_PAGE)
            except sqlite3.Error as exc:
                log.error("cannot read the event log of %s: %s", session_id, exc)
                stored = []
            if stored:
                return stored
        if index is not None:
            return [entries[index]]  # the hole is not stored anywhere (a failed write)
        return []


async def _held_back(log_: _Log) -> None:
    """Wait out the log's hold: until it is released, or its deadline (then it is lifted for all)."""
    hold = log_.hold
    assert hold is not None
    released, until = hold
    with trio.move_on_at(until):
        await released.wait()
    if log_.hold is hold:  # expired unreleased: nobody waits on it again
        log_.hold = None
        released.set()


def _index_after(entries: deque[dict[str, Any]], cursor: int) -> int | None:
    """Index of the first entry numbered above `cursor` (numbers increase), or None."""
    if not entries or entries[-1]["sequence_number"] <= cursor:
        return None
    guess = cursor + 1 - entries[0]["sequence_number"]  # exact when the numbers are contiguous
    if 0 <= guess < len(entries) and entries[guess]["sequence_number"] == cursor + 1:
        return guess
    lo, hi = 0, len(entries) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if entries[mid]["sequence_number"] <= cursor:
            lo = mid + 1
        else:
            hi = mid
    return lo
