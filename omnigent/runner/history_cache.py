"""The runner's copy of each session's last history: a cache, verified, bounded, never state.

Why: without it every model step carries the whole conversation from the
server, O(n) per step and O(n²) per conversation. With it (the runner's
hello announces `history_cache`) the server sends only the items after a
prefix, named by its length and its hash chain link (`protocol/history.py`),
and the runner rebuilds the full history from its copy: the model still gets
exactly the whole history every time.

What it guarantees:
- **Verified.** A prefix is used only when this copy's link at that length
  is the one the server named, under the same session generation; anything
  else (no copy, evicted, another generation, a shorter copy, a different
  link) is a miss, the copy is dropped, and the server sends the step in
  full (`HistoryMiss`). A rewritten item anywhere in the prefix changes the
  link, so rewritten failed turns and tool items cannot slip through.
- **Dropped on rebind.** Entries are keyed by session and carry its
  ownership generation, which every rebinding bumps: a step of another
  generation never uses, and replaces, the old copy.
- **Bounded.** LRU over sessions within `max_bytes` (64 MiB) in all, counted
  as the items' encoded bytes plus an allowance for their decoded objects;
  a history larger than the bound alone is not kept.
- Nothing here outlives the process or is needed for correctness: losing
  any entry costs one full resend.

Items are kept normalized (`wire.normalize_item`) with their request bytes
(`EncodedItems`), so the Responses body is a join of bytes encoded once.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from protocol import TurnStart
from protocol.history import ZERO, item_bytes, link

from .wire import EncodedItems, normalize_item

MAX_BYTES = 64 * 1024 * 1024


def cost(data: bytes) -> int:
    """What one item is counted as: its bytes, the decoded dict they stand for (a few times larger), its link."""
    return cost_of(len(data))


def cost_of(length: int) -> int:
    return 4 * length + 100


@dataclass
class _Entry:
    generation: int
    items: list[dict[str, Any]] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)     # each item's bytes
    links: list[bytes] = field(default_factory=list)
    joined: bytearray = field(default_factory=bytearray)  # the items' bytes, comma-separated
    size: int = 0
    truncations: int = 0  # a step's bytes (a prefix of `joined`) hold while this stays the same

    def truncate(self, count: int) -> None:
        if count >= len(self.items):
            return
        self.truncations += 1
        self.size -= sum(cost_of(n) for n in self.sizes[count:])
        del self.joined[sum(self.sizes[:count]) + max(count - 1, 0):]
        del self.items[count:], self.sizes[count:], self.links[count:]

    def extend(self, items: list[dict[str, Any]]) -> None:
        current = self.links[-1] if self.links else ZERO
        for item in items:
            item = normalize_item(item)
            data = item_bytes(item)
            current = link(current, data)
            if self.items:
                self.joined += b","
            self.joined += data
            self.items.append(item)
            self.sizes.append(len(data))
            self.links.append(current)
            self.size += cost_of(len(data))


class HistoryCache:
    """Session id -> the history of its last model step here (see the module docstring)."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self.bytes = 0
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._entries

    def remember(self, session_id: str, generation: int, items: list[dict[str, Any]]) -> EncodedItems:
        """A full history arrived: it replaces the session's copy; returned with its bytes."""
        self.drop(session_id)
        entry = _Entry(generation)
        entry.extend(items)
        return self._keep(session_id, entry)

    def extend(self, session_id: str, generation: int, count: int, link_hex: str,
               items: list[dict[str, Any]]) -> EncodedItems | None:
        """The first `count` items of the copy plus `items`, if the copy's link at `count` is `link_hex`.

        None (and the copy dropped) on any mismatch: the server then sends in full."""
        entry = self._entries.get(session_id)
        if (entry is None or entry.generation != generation or not 0 < count <= len(entry.links)
                or entry.links[count - 1].hex() != link_hex):
            self.drop(session_id)
            self.misses += 1
            return None
        self.hits += 1
        self._entries.pop(session_id)
        self.bytes -= entry.size
        entry.truncate(count)
        entry.extend(items)
        return self._keep(session_id, entry)

    def whole(self, start: TurnStart) -> TurnStart | None:
        """The step with its whole history: a full one is remembered, a delta extends the copy.

        None when the copy does not hold the prefix named (the runner then sends `HistoryMiss`)."""
        if not start.history_from:
            items = self.remember(start.session_id, start.generation, start.input)
        else:
            found = self.extend(start.session_id, start.generation, start.history_from,
                                start.history_hash, start.input)
            if found is None:
                return None
            items = found
        return dataclasses.replace(start, input=items, history_from=0, history_hash="")

    def drop(self, session_id: str) -> None:
        entry = self._entries.pop(session_id, None)
        if entry is not None:
            self.bytes -= entry.size

    def _keep(self, session_id: str, entry: _Entry) -> EncodedItems:
        cut = entry.truncations
        # no copy of the bytes: later steps only append to them, unless they truncate (then re-encoded)
        history = EncodedItems(entry.items, entry.joined, len(entry.joined), lambda: entry.truncations == cut)
        if entry.size > self.max_bytes:
            return history  # larger than the whole cache: used once, not kept
        self._entries[session_id] = entry
        self.bytes += entry.size
        while self.bytes > self.max_bytes:
            _, oldest = self._entries.popitem(last=False)
            self.bytes -= oldest.size
        return history


__all__ = ["MAX_BYTES", "HistoryCache", "cost"]
