"""Per-session ordered event logs that any number of clients can follow.

Each session's events get a sequence number and stay in a bounded in-memory
log, so a client that (re)connects with `after=N` first gets what it missed
and then the live tail. Followers read the shared log with their own cursor
and wait on a per-session trio.Event, so a slow client never blocks the
server and costs no per-client buffer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import trio

from protocol import events


@dataclass
class _Log:
    entries: deque[dict[str, Any]]
    last_seq: int = 0
    changed: trio.Event = field(default_factory=trio.Event)


class EventHub:
    def __init__(self, capacity: int = 10_000) -> None:
        self._capacity = capacity
        self._logs: dict[str, _Log] = {}
        self._closed = trio.Event()

    def _log(self, session_id: str) -> _Log:
        log = self._logs.get(session_id)
        if log is None:
            log = self._logs[session_id] = _Log(deque(maxlen=self._capacity))
        return log

    def session_ids(self) -> list[str]:
        """Sessions with a log in this server's life (created, resumed or followed)."""
        return list(self._logs)

    def last_seq(self, session_id: str) -> int:
        return self._log(session_id).last_seq

    def publish(self, session_id: str, type_: str, **fields: Any) -> dict[str, Any]:
        log = self._log(session_id)
        log.last_seq += 1
        event = events.make_event(type_, **fields)
        event["sequence_number"] = log.last_seq
        event.setdefault("session_id", session_id)
        log.entries.append(event)
        log.changed.set()
        log.changed = trio.Event()
        return event

    def close(self) -> None:
        """Wake every follower so it can end (server shutdown)."""
        self._closed.set()
        for log in self._logs.values():
            log.changed.set()

    async def follow(self, session_id: str, after: int | None = None) -> AsyncIterator[dict[str, Any]]:
        """Events with sequence_number > after, then live ones; None = live only."""
        log = self._log(session_id)
        cursor = log.last_seq if after is None else after
        while not self._closed.is_set():
            changed = log.changed
            while cursor < log.last_seq:
                # sequence numbers are contiguous: index straight to the next one
                # (cheap near the live tail; evicted ones are skipped)
                first = log.last_seq - len(log.entries) + 1
                cursor = max(cursor, first - 1)
                event = log.entries[cursor - first + 1]
                cursor = event["sequence_number"]
                yield event
            await changed.wait()
