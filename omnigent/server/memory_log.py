"""The memory log of one session: the recent events the hub keeps for its followers.

The hub appends each event here once it is numbered (stored, or numbered in
memory when the store failed) and wakes the session's followers through
`changed`; followers read from `entries` while it still holds what they
need and from the store otherwise.

What it guarantees:
- `entries` is bounded (the hub's capacity) and numbered in increasing order;
  `last_seq` is the newest number this process knows of, stored or not.
- Each kept event is the log's own copy (`_Kept`), which nothing changes
  after delivery, so its JSON text (`event_json`) is encoded once however
  many watchers send it: the text the store wrote when it has one
  (`EventHub._deliver`), else on a watcher's first ask.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import trio


@dataclass
class _Log:
    entries: deque[dict[str, Any]]
    last_seq: int = 0
    changed: trio.Event = field(default_factory=trio.Event)
    ended: bool = False  # the session was deleted: its followers stop
    # while the session's turn is being dispatched (`EventHub.hold`): released, and until when at most
    hold: tuple[trio.Event, float] | None = None


class _Kept(dict):  # type: ignore[type-arg]
    """An event as the memory log keeps it: a copy made at delivery, with its JSON text
    (the stored one, or encoded once a watcher has asked for it: `event_json`)."""

    __slots__ = ("json",)
    json: str


def event_json(event: dict[str, Any]) -> str:
    """The event as the streams send it, `json.dumps(event)`.

    Encoded once per event the memory log keeps, however many watchers send it: the
    log holds its own copy of each delivered event, which nothing changes afterwards.
    Events read back from the store, heartbeats and snapshots are encoded each time.
    """
    text = getattr(event, "json", None)
    if text is None:
        text = json.dumps(event)
        if isinstance(event, _Kept):
            event.json = text
    return text
