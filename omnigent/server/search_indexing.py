"""The search index caught up in batches while the server runs (store/search.py).

The store's triggers only queue a new or changed message; a search indexes what
is queued before it reads, so it never misses one. This task keeps the queue
short on a busy server: every `INDEX_EVERY` s, what was queued meanwhile is
indexed in one write transaction (one FTS5 segment for the batch, where each
turn's transaction used to write its own), so a search after a busy hour does
not pay for all of it at once.

It runs beside the WAL checkpointer for as long as the hub runs (`EventHub.run`).
A failure (a full disk, say) is logged and tried again at the next round; the
queue loses nothing meanwhile.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import TYPE_CHECKING

from .ticks import sleep_to_tick

if TYPE_CHECKING:
    from ..store import Store

log = logging.getLogger("omnigent.server.hub")  # the hub's, as the checkpointer's records are

INDEX_EVERY = 2.0  # s: ~300 messages a batch at 80 turns/s; a lone turn's two in the next round


async def index_in_batches(store: Store, every: float = INDEX_EVERY) -> None:
    """Index the queued messages every `every` seconds (on the server's ticks: `ticks.py`), until cancelled."""
    while True:
        await sleep_to_tick(every)
        try:
            store.index_pending_messages()
        except sqlite3.Error as exc:
            log.warning("the search index could not catch up (tried again in %g s): %s", every, exc)
