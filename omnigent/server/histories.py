"""Each session's history built from what is new since its last model step, and what a runner holds.

Why: rebuilding the whole history for every model step (reading every
stored item, cleaning it, encoding it) is O(n) per step and O(n²) per
conversation, and so is sending it. `Histories` gives a step its history
(`history.build_history`'s, exactly) at the cost of what was stored since
the last step; `sent_base` says how much of it the runner that served the
last step holds already (`SentHistory`, kept per connection), so only the
rest goes on the wire (protocol/history.py, runner/history_cache.py).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from protocol.history import ZERO
from protocol.history import chain as history_chain

from .history import answered, build_history, clean_item, closed, is_user, well_formed

# What the settled parts of all sessions may hold together (estimated, see `_cost`).
MAX_MEMO_BYTES = 64 * 1024 * 1024


_ID_COST = 150


def _cost(data: bytes) -> int:
    # the item's bytes, plus the decoded dict they came from (a few times larger), plus the link
    return 4 * len(data) + 100


@dataclass
class Built:
    """One model step's history, with each item's request bytes and hash chain links
    (`protocol.history`). `items[:settled]` begin every later history of the session
    (while `epoch` stays the same): a runner's copy of them needs no check beyond its link."""

    items: list[dict[str, Any]]
    parts: list[bytes]
    links: list[bytes]
    settled: int
    epoch: int


@dataclass
class SentHistory:
    """What one runner connection was last sent of a session's history (`RunnerConn.histories`)."""

    generation: int  # the session's ownership generation then: a rebinding makes it stale
    count: int       # how many items
    link: bytes      # the chain link after the last of them
    settled: int     # how many of them were settled then ...
    epoch: int       # ... in this memo epoch


def sent_base(built: Built, sent: SentHistory | None, generation: int) -> int:
    """How many leading items of `built` the runner holds as it was sent them (0: send it all).

    All of what it was sent when that is still the start of this history
    (the link matches); else the part that was settled then, which no later
    step changes (a merged user message, a synthetic output answered since).
    The runner checks the link either way."""
    if sent is None or sent.generation != generation:
        return 0
    if 0 < sent.count <= len(built.links) and built.links[sent.count - 1] == sent.link:
        return sent.count
    if sent.epoch == built.epoch:
        return min(sent.settled, built.settled)
    return 0


@dataclass
class _Memo:
    """A session's settled history: stored items [0, settled_pos) built once and for all."""

    epoch: int
    last_id: str | None = None                      # the last stored item read
    positions: dict[str, int] = field(default_factory=dict)  # item id -> position
    ids: list[str] = field(default_factory=list)    # item id by position
    tail: list[dict[str, Any]] = field(default_factory=list)  # stored items from settled_pos on
    settled_pos: int = 0
    items: list[dict[str, Any]] = field(default_factory=list)
    parts: list[bytes] = field(default_factory=list)
    links: list[bytes] = field(default_factory=list)
    calls: set[Any] = field(default_factory=set)    # call ids of the settled function_calls
    outputs: set[Any] = field(default_factory=set)  # ... and of their outputs
    cost: int = 0


class Histories:
    """`build_history` per session, computed from what is new since the session's last step.

    Why: rebuilding the whole history for every model step (reading every
    stored item, cleaning it, encoding it) is O(n) per step and O(n²) per
    conversation. Stored items are append-only (positions dense, never
    reused), so each session keeps a *settled* part: the history of its
    stored items [0, p), which no later item can change, with each item's
    bytes and chain link. A step reads only the items stored after the last
    one it read (`list_items(after=)`), builds the rest (the *tail*) with the
    same rules, given the settled part as context, and moves the settled
    point up to the last tail item after which nothing can change it:

    - that item is kept, is not a user message (a later user message would be
      merged into it) and is not a function_call;
    - every function_call up to it has its output up to it (else a later
      output, or a synthetic one, would land in between), and no output up
      to it came before its call;
    - every stored item up to it is part of this step's history (all of them
      are part of every later history).

    What comes out is exactly `build_history(all items, ...)`. Anything
    unexpected (the last item read is gone, the turn's message is not found,
    the settled part holds items another turn's history leaves out) builds
    from scratch and starts the session's memo again (a new `epoch`).
    Sessions are kept LRU within `max_bytes` (estimated).
    """

    def __init__(self, max_bytes: int = MAX_MEMO_BYTES) -> None:
        self.max_bytes = max_bytes
        self._memos: OrderedDict[str, _Memo] = OrderedDict()
        self._epochs = 0
        self.bytes = 0

    def forget(self, session_id: str) -> None:
        memo = self._memos.pop(session_id, None)
        if memo is not None:
            self.bytes -= memo.cost

    def build(self, store: Any, session_id: str, input_item_id: str | None, turn_id: str | None, *,
              turn_items: list[dict[str, Any]] | None = None) -> Built:
        """The history of the model step of `turn_id` (its user message `input_item_id`), from `store`.

        `turn_items`: the turn's items (`list_turn_items`) as the caller read them, with no write since."""
        memo = self._read(store, session_id)
        if turn_id is None:
            turn_ids: set[str] = set()
        else:
            turn_ids = {i["id"] for i in (store.list_turn_items(session_id, turn_id) if turn_items is None
                                          else turn_items)}
        end = memo.positions.get(input_item_id) if input_item_id is not None else len(memo.ids) - 1
        if end is None or any(memo.ids[pos] not in turn_ids for pos in range(end + 1, memo.settled_pos)):
            return self._from_scratch(store, session_id, input_item_id, turn_id, turn_ids)
        base = memo.settled_pos
        chosen = [(pos, item) for pos, item in enumerate(memo.tail, base) if pos <= end or item["id"] in turn_ids]
        cleaned = [(pos, clean_item(item)) for pos, item in chosen]
        before = memo.items[-1] if memo.items else None
        tail = closed(answered(well_formed(c for _, c in cleaned), memo.calls, memo.outputs), before)
        parts, links = history_chain(tail, memo.links[-1] if memo.links else ZERO)
        built = Built(memo.items + tail, memo.parts + parts, memo.links + links, 0, memo.epoch)
        self._settle(memo, cleaned, tail, parts, links)
        built.settled = len(memo.items)  # the settled point moved within this history
        self._memos.move_to_end(session_id)
        self._evict(keep=session_id)
        return built

    def _read(self, store: Any, session_id: str) -> _Memo:
        memo = self._memos.get(session_id)
        if memo is None:
            memo = self._new(session_id)
        try:
            new = store.list_items(session_id, after=memo.last_id) if memo.last_id else store.list_items(session_id)
        except LookupError:  # the last item read is gone (NotFoundError): the conversation changed
            self.forget(session_id)
            memo = self._new(session_id)
            new = store.list_items(session_id)
        for item in new:
            memo.positions[item["id"]] = len(memo.ids)
            memo.ids.append(item["id"])
        memo.cost += _ID_COST * len(new)  # every item read keeps its id and position
        self.bytes += _ID_COST * len(new)
        memo.tail.extend(new)
        if new:
            memo.last_id = new[-1]["id"]
        return memo

    def _new(self, session_id: str) -> _Memo:
        self._epochs += 1
        memo = self._memos[session_id] = _Memo(epoch=self._epochs)
        return memo

    def _from_scratch(self, store: Any, session_id: str, input_item_id: str | None, turn_id: str | None,
                      turn_items: set[str]) -> Built:
        self.forget(session_id)
        items = build_history(store.list_items(session_id), input_item_id, turn_id, turn_items=turn_items)
        parts, links = history_chain(items)
        self._new(session_id)  # a later step starts its memo again, from a new epoch
        return Built(items, parts, links, 0, self._epochs)

    def _settle(self, memo: _Memo, cleaned: list[tuple[int, dict[str, Any] | None]], tail: list[dict[str, Any]],
                parts: list[bytes], links: list[bytes]) -> None:
        """Move the settled point up as far as the rules above allow."""
        calls, outputs = set(memo.calls), set(memo.outputs)
        pending: set[Any] = set()
        cut: tuple[int, dict[str, Any]] | None = None
        expected = memo.settled_pos
        for pos, item in cleaned:
            if pos != expected:  # an item this history leaves out: later ones may include it
                break
            expected += 1
            if item is None:
                continue
            kind = item.get("type")
            call_id = item.get("call_id")
            if kind == "function_call":
                calls.add(call_id)
                if call_id not in outputs:
                    pending.add(call_id)
                continue
            if kind == "function_call_output":
                if call_id not in calls:
                    break  # an output before its call: build_history decides it with the whole list
                outputs.add(call_id)
                pending.discard(call_id)
            if not pending and not is_user(item):
                cut = (pos, item)
        if cut is None:
            return
        pos, item = cut
        out = next(i for i, sent in enumerate(tail) if sent is item) + 1
        memo.items += tail[:out]
        memo.parts += parts[:out]
        memo.links += links[:out]
        for sent in tail[:out]:
            if sent.get("type") == "function_call":
                memo.calls.add(sent.get("call_id"))
            elif sent.get("type") == "function_call_output":
                memo.outputs.add(sent.get("call_id"))
        added = sum(_cost(data) for data in parts[:out])
        memo.cost += added
        self.bytes += added
        del memo.tail[:pos + 1 - memo.settled_pos]
        memo.settled_pos = pos + 1

    def _evict(self, keep: str) -> None:
        while self.bytes > self.max_bytes and len(self._memos) > 1:
            oldest = next(iter(self._memos))
            if oldest == keep:
                self._memos.move_to_end(oldest)
                continue
            self.forget(oldest)
        if self.bytes > self.max_bytes:  # one session alone is larger than the bound
            self.forget(keep)
