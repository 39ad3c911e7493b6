"""Per-session ordered event logs that any number of clients can follow and resume.

Every event a session's watchers see is stored (`store/events.py`) under a
per-session sequence number before anyone sees it, so a client that
reconnects with `after=N`, even to a restarted server, gets exactly what
came after N and then the live tail. The store allocates the numbers, so
they stay unique when several omnigent processes share one file.

What it guarantees:
- `publish` stores, then wakes followers; `transaction()` puts events into
  the same store transaction as the state change they report (the caller's
  writes inside it join it), so a crash never leaves one without the other.
- Text deltas, the bulk of a turn, are buffered (and whatever goes through
  `publish_soon`) and written by `run()` in one transaction, at most one such
  transaction per `batch_interval` (20 ms). A delta buffered when `run()` wrote
  none for that long goes at once (a stream's first token waits for no
  timer); later ones go `batch_interval` after the last write, and a buffer
  of other events alone `batch_interval` after it began. Any other event
  writes the buffered ones first, in its own transaction, so order is kept
  and they cost no transaction of their own. Without `run()` (tests, tools)
  every delta is written at once.
- Followers read recent events from a bounded memory log and older ones
  from the store (the logs are bounded per session and, when there is a
  store, across sessions: `KEPT_EVENTS`); they wait on a per-session
  trio.Event, so a slow client costs no buffer and never blocks the server. A cursor below what is kept
  (before the log existed, or compacted) or above the newest number gets
  one `session.resync` with a snapshot instead: never silence, never a hole.
- A store that fails (a full disk) does not stop the stream: the event is
  numbered in memory after the newest stored one and logged as an error.

Events of another process sharing the file are seen when a follower next
reads past a hole in this process's numbers (or on reconnect), not live.

This module is the writing side (numbering, batching, transactions) and
`EventHub` itself; the reading side is `following.py` (a mixin of it), the
memory log and its once-encoded JSON `memory_log.py`, and the WAL
checkpoints `run()` takes over `checkpoints.py`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sqlite3
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import trio

from protocol import events

from ..config import collector
from ..config.timeline import watch_gc
from .checkpoints import _Checkpointer
from .following import FollowingMixin
from .memory_log import _Kept, _Log
from .search_indexing import index_in_batches

if TYPE_CHECKING:
    from ..store import Store

log = logging.getLogger("omnigent.server.hub")

BATCH_INTERVAL = 0.02   # deltas reach the store (and watchers) at most this late
HEARTBEAT_EVERY = 15.0  # seconds of silence before a `session.heartbeat`
HOLD_MAX = 0.02         # the longest a turn's dispatch holds its session's watchers back (`hold`)
DELTA_TURNS = 50        # ended turns whose deltas are kept (OMNIGENT_EVENT_DELTA_TURNS)
# events kept in memory across every session's log (~700 B each: ~70 MB, by
# scripts/bench_hub_memory.py), beyond which the logs of the sessions least recently
# published to are emptied (`_keep_within_budget`)
KEPT_EVENTS = 100_000


def delta_turns_from_env(environ: dict[str, str] | os._Environ = os.environ) -> int:
    raw = environ.get("OMNIGENT_EVENT_DELTA_TURNS")
    if raw is None:
        return DELTA_TURNS
    try:
        value = int(raw)
        if value < 0:
            raise ValueError
    except ValueError:
        log.warning("OMNIGENT_EVENT_DELTA_TURNS=%r is not a whole number >= 0; using %d", raw, DELTA_TURNS)
        return DELTA_TURNS
    return value


class Transaction:
    """Events collected inside `EventHub.transaction()`; numbered and stored at its end."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.events: list[dict[str, Any]] = []

    def publish(self, type_: str, **fields: Any) -> dict[str, Any]:
        event = events.make_event(type_, **fields)
        event.setdefault("session_id", self.session_id)
        self.events.append(event)
        return event


class EventHub(FollowingMixin):
    def __init__(self, store: Store | None = None, capacity: int = 10_000, *,
                 delta_turns: int | None = None, batch_interval: float = BATCH_INTERVAL,
                 kept_events: int = KEPT_EVENTS) -> None:
        self.store = store
        self._capacity = capacity
        self._logs: dict[str, _Log] = {}
        self._kept_budget = max(kept_events, capacity)
        self._kept = 0  # entries held by all the logs
        self._recent: dict[str, None] = {}  # sessions whose log holds entries, least recently published first
        self._closed = trio.Event()
        self.delta_turns = delta_turns_from_env() if delta_turns is None else delta_turns
        self.batch_interval = batch_interval
        self._batching = False  # run() is flushing deltas
        self._pending: list[tuple[str, dict[str, Any]]] = []
        self._pending_wake = trio.Event()
        self._written_at = -math.inf  # when run() last wrote buffered events (trio's clock)

    # --- the log of one session ------------------------------------------------

    def _log(self, session_id: str) -> _Log:
        log_ = self._logs.get(session_id)
        if log_ is None:
            log_ = self._logs[session_id] = _Log(deque(maxlen=self._capacity))
            self._refresh(session_id, log_)
        return log_

    def _refresh(self, session_id: str, log_: _Log) -> None:
        if self.store is not None:
            try:
                log_.last_seq = max(log_.last_seq, self.store.last_event_seq(session_id))
            except sqlite3.Error as exc:
                log.error("cannot read the event log of %s: %s", session_id, exc)

    def session_ids(self) -> list[str]:
        """Sessions with a log in this server's life (created, resumed or followed)."""
        return list(self._logs)

    def last_seq(self, session_id: str) -> int:
        """The newest sequence number of the session, in this process or the store."""
        log_ = self._log(session_id)
        self._refresh(session_id, log_)
        return log_.last_seq

    # --- holding the followers back while a turn is dispatched ---------------------

    def hold(self, session_id: str) -> None:
        """Hold this session's followers back while its turn is dispatched, until `release`.

        Why: on one event loop, the watchers' writes of the turn's first events
        (input consumed, running, created: ~0.3 ms of CPU each) interleave with
        the dispatch and the TurnStart's write, and the runner gets its step
        later by as much. Held, the followers read those events (none is lost:
        they are logged as ever) once the runner has its step, and the post that
        queued the turn writes its answer then too (`dispatched`). A dispatch that
        starts to wait (for a runner, for another process's claim) releases
        them; anything else holds them back `HOLD_MAX` at most. A hold already
        in place is kept as it is."""
        log_ = self._log(session_id)
        if log_.hold is None:
            log_.hold = (trio.Event(), trio.current_time() + HOLD_MAX)

    def release(self, session_id: str) -> None:
        """The dispatch is done (or gave up): the session's followers go on. Idempotent."""
        log_ = self._logs.get(session_id)
        if log_ is not None and log_.hold is not None:
            log_.hold[0].set()
            log_.hold = None

    # --- publishing ------------------------------------------------------------

    def publish(self, session_id: str, type_: str, **fields: Any) -> dict[str, Any]:
        """Store one event and wake its followers; returns it (numbered once stored)."""
        if type_ == events.TEXT_DELTA:
            return self.publish_soon(session_id, type_, **fields)
        event = events.make_event(type_, **fields)
        event.setdefault("session_id", session_id)
        self._store(session_id, [event])
        return event

    def publish_soon(self, session_id: str, type_: str, **fields: Any) -> dict[str, Any]:
        """`publish`, batched as text deltas are: stored (then published) with the next event
        written, or by `run()`: with a text delta among them at once, unless run() wrote
        less than `batch_interval` ago (then `batch_interval` after that write); without one,
        `batch_interval` after they began.

        For an event with no store change of its own that something else follows at once (an
        item the runner relays just before its step's end): it costs no transaction of its own."""
        event = events.make_event(type_, **fields)
        event.setdefault("session_id", session_id)
        if self._batching and self.store is not None:
            self._pending.append((session_id, event))
            self._pending_wake.set()
            return event
        self._store(session_id, [event])
        return event

    @contextlib.contextmanager
    def transaction(self, session_id: str) -> Iterator[Transaction]:
        """Events that commit with the store writes made inside the block, or not at all.

        ```
        with hub.transaction(sid) as tx:
            store.finish_turn(turn_id, "completed")   # joins the transaction
            tx.publish(ev.COMPLETED, turn_id=turn_id, response=response)
        ```
        Nothing inside may await: another task's write would join it. If
        the block raises, nothing is stored and nothing is published.
        """
        tx = Transaction(session_id)
        if self.store is None:
            yield tx
            self._deliver(session_id, tx.events)
            return
        buffered = self._take_buffered()  # written first, in this same transaction: order kept
        log_ = self._log(session_id)
        texts: list[str] | None = None
        try:
            with self.store.event_transaction():
                buffered_texts = self._append_buffered(buffered)
                yield tx
                if tx.events:
                    texts = self.store.append_events(session_id, tx.events, at_least=log_.last_seq,
                                                     keep_turns=self.delta_turns)
        except BaseException:  # nothing of the block is stored: the buffered events go on their own
            _unnumber(buffered)
            self._write_buffered(buffered)
            raise
        self._deliver_buffered(buffered, buffered_texts)
        self._deliver(session_id, tx.events, texts)

    def flush(self) -> None:
        """Write the buffered events (one transaction for all sessions), then publish them."""
        self._write_buffered(self._take_buffered())

    def _take_buffered(self) -> dict[str, list[dict[str, Any]]]:
        """The buffered events by session, in order, taken out of the buffer."""
        by_session: dict[str, list[dict[str, Any]]] = {}
        if not self._pending:
            return by_session
        pending, self._pending = self._pending, []
        self._pending_wake = trio.Event()
        for session_id, event in pending:
            by_session.setdefault(session_id, []).append(event)
        return by_session

    def _append_buffered(self, buffered: dict[str, list[dict[str, Any]]]) -> dict[str, list[str]]:
        """Store the buffered events (inside an event transaction); their stored texts by session."""
        return {session_id: self.store.append_events(session_id, batch,  # type: ignore[union-attr]
                                                     at_least=self._log(session_id).last_seq)
                for session_id, batch in buffered.items()}

    def _deliver_buffered(self, buffered: dict[str, list[dict[str, Any]]],
                          texts: dict[str, list[str]] | None = None) -> None:
        for session_id, batch in buffered.items():
            self._deliver(session_id, batch, texts.get(session_id) if texts else None)

    def _write_buffered(self, buffered: dict[str, list[dict[str, Any]]]) -> None:
        if not buffered:
            return
        texts = None
        try:
            with self.store.event_transaction():  # type: ignore[union-attr]
                texts = self._append_buffered(buffered)
        except sqlite3.Error as exc:
            log.error("cannot store %d buffered events: %s", sum(map(len, buffered.values())), exc)
            _unnumber(buffered)
        self._deliver_buffered(buffered, texts)

    def _store(self, session_id: str, batch: list[dict[str, Any]]) -> None:
        """Store `batch` (after the buffered events, in the same transaction), then publish them all."""
        buffered = self._take_buffered()
        buffered_texts = texts = None
        if self.store is not None:
            log_ = self._log(session_id)
            try:
                with self.store.event_transaction():
                    buffered_texts = self._append_buffered(buffered)
                    texts = self.store.append_events(session_id, batch, at_least=log_.last_seq,
                                                     keep_turns=self.delta_turns)
            except sqlite3.Error as exc:  # watchers still hear it; it is not replayable
                log.error("cannot store event %s of %s: %s", batch[0]["type"], session_id, exc)
                buffered_texts = texts = None
                _unnumber(buffered)
                _unnumber({session_id: batch})
        self._deliver_buffered(buffered, buffered_texts)
        self._deliver(session_id, batch, texts)

    def _deliver(self, session_id: str, batch: list[dict[str, Any]], texts: list[str] | None = None) -> None:
        """Append `batch` to the session's memory log and wake its followers.

        `texts`: the JSON the store wrote for each event (`append_events`), which is what
        `event_json` would encode for the log's copy: nothing changed the events since."""
        if not batch:
            return
        log_ = self._log(session_id)
        held = len(log_.entries)
        for i, event in enumerate(batch):
            if "sequence_number" not in event:  # no store, or it failed: numbered here
                event["sequence_number"] = log_.last_seq + 1
            log_.last_seq = max(log_.last_seq, event["sequence_number"])
            kept = _Kept(event)
            if texts is not None:
                kept.json = texts[i]
            log_.entries.append(kept)
        self._kept += len(log_.entries) - held
        self._recent.pop(session_id, None)
        self._recent[session_id] = None
        if self._kept > self._kept_budget:
            self._keep_within_budget(session_id)
        log_.changed.set()
        log_.changed = trio.Event()

    def _keep_within_budget(self, publishing: str) -> None:
        """Empty the memory logs of the sessions least recently published to, down to the budget.

        Each log is bounded (`capacity`), but a long-running server follows
        ever more sessions: without this their logs would grow with the
        number of sessions served, not with the ones in use. The store holds
        every event, so a follower of an emptied log reads it from there
        (`following.py`); a follower at the live tail needs none of it. (An
        event whose write failed lived only here: a late follower misses it
        then, as it does after a restart.) With no store the logs are the
        only copy and are left alone.
        """
        if self.store is None:
            return
        while self._kept > self._kept_budget:
            oldest = next(iter(self._recent))
            if oldest == publishing:  # the only one left: its own log is bounded by `capacity`
                return
            del self._recent[oldest]
            entries = self._logs[oldest].entries
            self._kept -= len(entries)
            entries.clear()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Batch text deltas for as long as it runs (the server's nursery runs it).

        Also checkpoints the WAL itself, in a worker thread on a connection of
        its own, instead of SQLite's automatic checkpoint inside whichever
        commit crosses 1,000 pages (a pause of the event loop of several ms
        under load, in the middle of some turn), and indexes the messages the
        search triggers queued, in batches (`search_indexing`). While it runs, the loop's
        garbage collections happen as it waits (`collector.idle_collections`). With
        `OMNIGENT_STALLS` set, garbage collections, slow commits and checkpoints are recorded
        by name.
        """
        watch_gc()
        collector.tune()  # the server runs: what start-up loaded lives as long as it does
        # its collections while it waits (for a model, a client), not in the middle of a turn's work
        idle_collections = collector.idle_collections()
        trio.lowlevel.add_instrument(idle_collections)
        self._batching = True
        task_status.started()
        checkpoint = _Checkpointer.start(self.store)
        try:
            async with trio.open_nursery() as nursery:
                if checkpoint is not None:
                    nursery.start_soon(checkpoint.run)
                if self.store is not None:
                    nursery.start_soon(index_in_batches, self.store)
                while True:
                    await self._pending_wake.wait()
                    if any(event["type"] == events.TEXT_DELTA for _, event in self._pending):
                        # text for watchers: at once, unless written lately
                        await trio.sleep_until(self._written_at + self.batch_interval)
                    else:  # relayed items alone: what follows them at once takes them along
                        await trio.sleep(self.batch_interval)
                    if self._pending:
                        self.flush()
                        self._written_at = trio.current_time()
        finally:
            # only once the nursery is done: it waited for a checkpoint's thread still running
            # (shielded), whose connection `stop` closes (closed under it: a segfault)
            if checkpoint is not None:
                checkpoint.stop()
            trio.lowlevel.remove_instrument(idle_collections)
            self._batching = False
            self.flush()

    def close(self) -> None:
        """Write what is buffered and wake every follower so it can end (server shutdown)."""
        self.flush()
        self._closed.set()
        for log_ in self._logs.values():
            log_.changed.set()

    def end_session(self, session_id: str) -> None:
        """The session was deleted: its followers' streams end, its log and buffered deltas go."""
        self._pending = [(sid, event) for sid, event in self._pending if sid != session_id]
        log_ = self._logs.pop(session_id, None)
        if log_ is not None:
            self._kept -= len(log_.entries)
            self._recent.pop(session_id, None)
            log_.ended = True
            log_.changed.set()


def _unnumber(by_session: dict[str, list[dict[str, Any]]]) -> None:
    """Their transaction did not commit: the numbers it gave them are not theirs."""
    for batch in by_session.values():
        for event in batch:
            event.pop("sequence_number", None)
