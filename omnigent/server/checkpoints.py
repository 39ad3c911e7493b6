"""WAL checkpoints of the store's file, taken over from SQLite by the event hub.

SQLite checkpoints the WAL itself inside whichever commit crosses 1,000
pages: a pause of the event loop of several ms under load, in the middle of
some turn. While `EventHub.run()` runs, `_Checkpointer` does it instead,
PASSIVE, in a worker thread on a connection of its own, and gives the store's
connection its automatic checkpoint back when it stops.

What it guarantees:
- Only a file-backed store in WAL mode is taken over (`start` returns None
  otherwise, and nothing changes).
- A checkpoint running in its thread is never abandoned: it is shielded, and
  the connection it uses is closed only by `stop`, after the nursery that ran
  it has finished.
- A failed checkpoint is logged (as the hub's) and tried again later; it never
  stops the hub.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from typing import TYPE_CHECKING

import trio

from ..config.timeline import stall
from .ticks import sleep_to_tick

if TYPE_CHECKING:
    from ..store import Store

log = logging.getLogger("omnigent.server.hub")  # the hub's: its records keep the name they had


class _Checkpointer:
    """WAL checkpoints off the event loop: PASSIVE, in a worker thread, on a connection of its own.

    Once the WAL file has grown to WAL_PAGES pages (SQLite's own threshold),
    a checkpoint runs every EVERY seconds; each copies only the frames added
    since the last (the file keeps its size, as with SQLite's automatic
    checkpoint, and is reused from its start). sqlite3 releases the GIL while
    it copies, so the loop goes on serving meanwhile.

    It looks on the server's ticks (`ticks.py`): every EVERY seconds while the
    store's connection writes, every IDLE_EVERY (with the pings, at their
    default interval) once it has written nothing since the last look, so an
    idle server is not woken for it alone.
    """

    WAL_PAGES = 1000    # SQLite's own autocheckpoint threshold
    EVERY = 0.5         # seconds between two looks at the WAL's size, while the store is written
    IDLE_EVERY = 1.0    # ... and once it has not been since the last look

    def __init__(self, store: Store, path: str) -> None:
        self.store, self.path = store, path
        self._conn: sqlite3.Connection | None = None

    @classmethod
    def start(cls, store: Store | None) -> _Checkpointer | None:
        """Take the checkpoints over from the store's connection; None where it cannot (no WAL file)."""
        if store is None or str(getattr(store, "path", ":memory:")) == ":memory:":
            return None
        try:
            mode = store.conn.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() != "wal":
                return None
            store.conn.execute("PRAGMA wal_autocheckpoint=0")
        except (sqlite3.Error, AttributeError):
            return None
        return cls(store, str(store.path))

    def stop(self) -> None:
        try:
            self.store.conn.execute(f"PRAGMA wal_autocheckpoint={self.WAL_PAGES}")  # SQLite's default again
        except sqlite3.Error:
            pass
        if self._conn is not None:
            self._conn.close()  # the thread is done: run()'s nursery waited for it
            self._conn = None

    async def run(self) -> None:
        page = 4096
        try:
            page = int(self.store.conn.execute("PRAGMA page_size").fetchone()[0])
        except sqlite3.Error:
            pass
        every, seen = self.EVERY, self.store.conn.total_changes
        while True:
            await sleep_to_tick(every)
            changes = self.store.conn.total_changes  # rows this connection wrote: a write since the last look
            every, seen = (self.EVERY if changes != seen else self.IDLE_EVERY), changes
            if self._wal_size() >= self.WAL_PAGES * page:
                with trio.CancelScope(shield=True):  # never abandon a thread holding the connection
                    await trio.to_thread.run_sync(self._checkpoint)

    def _wal_size(self) -> int:
        try:
            return os.stat(self.path + "-wal").st_size
        except OSError:
            return 0  # none yet (or gone): nothing to copy

    def _checkpoint(self) -> None:
        started = time.perf_counter()
        try:
            if self._conn is None:
                self._conn = sqlite3.connect(self.path, timeout=5.0, check_same_thread=False)
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as exc:
            log.warning("WAL checkpoint failed: %s", exc)
            return
        stall("wal_checkpoint", time.perf_counter() - started)  # in a thread: not a pause of the loop
