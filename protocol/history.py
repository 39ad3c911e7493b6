"""How server and runner agree that the runner's copy of a history is the server's.

A runner that announces `HISTORY_CACHE` in its hello keeps the history of
each session's last model step (`omnigent/runner/history_cache.py`), so the
next `TurnStart` to it may carry only the items after the first
`history_from` (`omnigent/server/history.py` decides). Both sides then name
a prefix of the history by its length and a hash chain over its items:

    link(0) = ZERO
    link(k) = sha256(link(k - 1) + item_bytes(item[k - 1]))

so the hash of any prefix is one stored link, extending by one item costs one
encoding and one sha256, and a copy that differs anywhere in the prefix
(an item rewritten, dropped or reordered) has another link. `item_bytes` is
the item as the model request carries it (the openai SDK's own JSON
settings: compact, UTF-8, no NaN), so the runner hashes the very bytes it
sends and encodes each item once.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

HISTORY_CACHE = "history_cache"  # the Hello feature: "send me deltas of histories"
ZERO = bytes(32)

_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def item_bytes(item: Any) -> bytes:
    """One history item as UTF-8 JSON, exactly as `openai._utils._json.openapi_dumps` writes it."""
    return _encoder.encode(item).encode()


def link(previous: bytes, data: bytes) -> bytes:
    """The chain's next link: `previous` extended by one item's bytes."""
    return hashlib.sha256(previous + data).digest()


def chain(items: list[Any], start: bytes = ZERO) -> tuple[list[bytes], list[bytes]]:
    """Each item's bytes and the link after it, from `start` (the link before the first)."""
    encoded = [item_bytes(item) for item in items]
    links = []
    current = start
    for data in encoded:
        current = link(current, data)
        links.append(current)
    return encoded, links


__all__ = ["HISTORY_CACHE", "ZERO", "chain", "item_bytes", "link"]
