"""Scripted state of the mock LLM: keyed queues, routing, captures and gates.

Kept apart from the HTTP layer so the routing rules of the mock protocol
(reference §6.2) live in one plain, framework-free place. Everything here is
synchronous except `MockState.park`, and the server runs on a single trio
thread, so no lock is needed: a request's pop/capture can never interleave
with another handler (the original needed an asyncio lock only because its
handlers awaited between steps).
"""

from __future__ import annotations

import hashlib
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import trio

DEFAULT_KEY = "default"
DEFAULT_TEXT = "Mock LLM response"


class EntryError(ValueError):
    """A scripted entry (or a control-endpoint body) has the wrong shape."""


def normalize_entry(raw: Any) -> dict[str, Any]:
    """Check one scripted entry and return it as a dict.

    A bare string is accepted as shorthand for `{"text": ...}`. Shapes are
    checked at configure time so a bad script fails the test's configure
    call with a 400 instead of a confusing 500 in the middle of a run.
    """
    if isinstance(raw, str):
        return {"text": raw}
    if not isinstance(raw, dict):
        raise EntryError(f"entry must be an object or a string, got {type(raw).__name__}")
    entry = dict(raw)
    if "text" in entry and entry["text"] is not None and not isinstance(entry["text"], str):
        raise EntryError("entry.text must be a string")
    tool_calls = entry.get("tool_calls")
    if tool_calls is not None:
        if not isinstance(tool_calls, list) or not all(
            isinstance(tc, dict) and isinstance(tc.get("name"), str) for tc in tool_calls
        ):
            raise EntryError('entry.tool_calls must be a list of {"name", "arguments"} objects')
    native = entry.get("native_items")
    if native is not None and (
        not isinstance(native, list) or not all(isinstance(it, dict) for it in native)
    ):
        raise EntryError("entry.native_items must be a list of objects")
    status = entry.get("status_code")
    if status is not None and (
        not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599
    ):
        raise EntryError("entry.status_code must be an HTTP status integer")
    retry_after = entry.get("retry_after")
    if retry_after is not None and (isinstance(retry_after, bool) or not isinstance(retry_after, (int, float, str))):
        raise EntryError("entry.retry_after must be a number of seconds or an HTTP date string")
    drop = entry.get("drop_after")
    if drop is not None and (isinstance(drop, bool) or not isinstance(drop, int) or drop < 0):
        raise EntryError("entry.drop_after must be a number of characters (0 or more)")
    return entry


@dataclass
class KeyedQueue:
    """One key's FIFO script.

    Entries are kept (with an index) rather than popped so a configure can be
    inspected later; the fallback is separate because it outlives
    configure and reset.
    """

    entries: list[dict[str, Any]] = field(default_factory=list)
    index: int = 0
    match: str | None = None
    fallback: dict[str, Any] | None = None

    def next_entry(self) -> dict[str, Any]:
        if self.index < len(self.entries):
            entry = self.entries[self.index]
            self.index += 1
            return entry
        # Exhausted queues never error: tests that script fewer turns than the
        # agent makes must still get an answer.
        if self.fallback is not None:
            return dict(self.fallback)
        return {"text": DEFAULT_TEXT}

    def clear_script(self) -> None:
        self.entries = []
        self.index = 0
        self.match = None


@dataclass
class Gate:
    """A request parked by a `block` entry, waiting for /gate/release."""

    gate_id: str
    key: str
    model: str | None
    since: float
    event: trio.Event = field(default_factory=trio.Event)

    def describe(self) -> dict[str, Any]:
        return {"gate_id": self.gate_id, "key": self.key, "model": self.model, "since": self.since}


def _content_texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    texts: list[str] = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                # input_text (Responses) and text (chat) parts both carry "text".
                texts.append(part["text"])
    return texts


def user_text(body: dict[str, Any]) -> str:
    """The user-authored text of a Responses (`input`) or chat (`messages`) body."""
    texts: list[str] = []
    raw_input = body.get("input")
    if isinstance(raw_input, str):
        # A bare string input is a single user message in the Responses API.
        texts.append(raw_input)
    for field_name in ("input", "messages"):
        items = body.get(field_name)
        if not isinstance(items, list):
            continue
        for item in items:
            if isinstance(item, dict) and item.get("role") == "user":
                texts.extend(_content_texts(item.get("content")))
    return "\n".join(texts)


class MockState:
    """All mutable state of one mock LLM server instance."""

    def __init__(self) -> None:
        self.queues: dict[str, KeyedQueue] = {}
        self.requests: list[dict[str, Any]] = []
        self.digests: list[str] = []  # sha256 of each request's exact body, as it came
        self.request_count = 0
        self.gates: dict[str, Gate] = {}
        # Gate ids never repeat within a server, even across resets, so a
        # stale id from an earlier test cannot release a new request.
        self._gate_ids = itertools.count(1)

    # -- control ---------------------------------------------------------

    def configure(self, key: str, responses: list[Any], match: str | None) -> int:
        entries = [normalize_entry(raw) for raw in responses]  # validate before mutating
        queue = self.queues.setdefault(key, KeyedQueue())
        queue.clear_script()
        queue.entries = entries
        queue.match = match or None
        return len(entries)

    def set_fallback(self, key: str, text: str, stream: bool) -> None:
        self.queues.setdefault(key, KeyedQueue()).fallback = {"text": text, "stream": stream}

    def reset(self) -> list[str]:
        """Forget the script; keep fallback queues (emptied). Returns released gate ids."""
        kept: dict[str, KeyedQueue] = {}
        for key, queue in self.queues.items():
            if queue.fallback is not None:
                # The fallback survives; leftover entries and the match token do
                # not, or a previous test's script would leak into the next.
                queue.clear_script()
                kept[key] = queue
        self.queues = kept
        self.requests.clear()
        self.digests.clear()
        self.request_count = 0
        return self.release(None)

    def release(self, gate_id: str | None) -> list[str]:
        """Release one gate by id, or every pending gate when `gate_id` is None."""
        if gate_id is None:
            targets = list(self.gates.values())
        elif gate_id in self.gates:
            targets = [self.gates[gate_id]]
        else:
            return []
        for gate in targets:
            # Removed here (not only when the parked handler wakes) so that
            # /gate/pending reflects the release immediately.
            self.gates.pop(gate.gate_id, None)
            gate.event.set()
        return [gate.gate_id for gate in targets]

    def pending(self) -> list[dict[str, Any]]:
        return [gate.describe() for gate in self.gates.values()]

    def captured(self, key: str | None) -> list[dict[str, Any]]:
        return [body for body, _ in self.captured_with_digests(key)]

    def captured_with_digests(self, key: str | None) -> list[tuple[dict[str, Any], str]]:
        pairs = list(zip(self.requests, self.digests))
        return pairs if key is None else [(body, digest) for body, digest in pairs if body.get("model") == key]

    # -- LLM requests ----------------------------------------------------

    def route(self, body: dict[str, Any]) -> str:
        """Pick the queue key for a request: match token, then model, then default."""
        text = user_text(body)
        best: str | None = None
        best_len = -1
        for key, queue in self.queues.items():
            token = queue.match
            # Longest token wins; on a tie the earlier-configured key wins.
            if token and token in text and len(token) > best_len:
                best, best_len = key, len(token)
        if best is not None:
            return best
        model = body.get("model")
        if isinstance(model, str) and model in self.queues:
            return model
        self.queues.setdefault(DEFAULT_KEY, KeyedQueue())
        return DEFAULT_KEY

    def take(self, body: dict[str, Any], raw: bytes = b"") -> tuple[str, dict[str, Any]]:
        """Count and capture a request (and the sha256 of its exact bytes), then pop its entry."""
        self.request_count += 1
        self.requests.append(body)
        self.digests.append(hashlib.sha256(raw).hexdigest())
        key = self.route(body)
        return key, self.queues[key].next_entry()

    async def park(self, key: str, model: str | None) -> None:
        """Wait until this request's gate is released (by id, all, or reset)."""
        gate = Gate(gate_id=f"gate-{next(self._gate_ids)}", key=key, model=model, since=time.time())
        self.gates[gate.gate_id] = gate
        try:
            await gate.event.wait()
        finally:
            # A client that disconnects while parked cancels us: drop the gate
            # so /gate/pending does not list a request nobody waits for.
            self.gates.pop(gate.gate_id, None)
