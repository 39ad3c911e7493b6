"""The conversation a turn sends to the model, built from the stored items.

Why it exists: many model servers (llama.cpp with Mistral-, Gemma- or
Llama-2-style chat templates) reject a conversation whose user and assistant
turns do not alternate, and the Responses API rejects omnigent's own fields
on input. The store keeps everything that happened, failed turns included;
this module turns that record into a conversation every server accepts.

The rules (the same for every harness and for items stored by any release):

- Items up to and including the turn's own user message, in order; then,
  when the turn is named, its own items stored after that message (the
  loop's earlier steps: text, `function_call`s and their outputs), up to the
  next user message.
- A user (or system/developer) message goes as `{role, content}` only.
- Every other item goes as the endpoint returned it, with its `id`, minus
  omnigent's own fields (`response_id`, `created_at`, `turn_id`).
- A `reasoning` item goes back only when it carries `encrypted_content`
  (without it, it is only a summary the API cannot take back).
- An assistant message without text is left out: no empty assistant messages.
- **A user message whose turn got no answer is merged into the next one.**
  A turn that failed (wrong key, unreachable server), was cancelled, or
  answered only with reasoning leaves its user message unanswered; the
  next user message is appended to it (text parts joined by a blank line)
  instead of following it as a second user message. Merging rather than
  leaving the unanswered message out keeps what the user said visible to
  the model, as it is in the transcript the user sees.
- A partial answer (a stream that dropped mid-answer, stored as
  `incomplete`) counts as an answer: the model sees what the user saw.
- **Every `function_call` is answered.** A call with no stored
  `function_call_output` (the turn failed after the model step, before its
  tools ran or were marked) gets a synthetic output, "not run: the turn
  failed", right after its step's calls; an output whose call is not sent is
  left out. Both APIs refuse a history that breaks either rule.
- **A turn that ended on tool results is closed.** When a user message
  follows a `function_call_output` (the turn failed, was cancelled or hit
  `max_steps` after its tools ran), a short assistant message saying so
  goes between them, `{"type": "message", "role": "assistant", "content":
  NO_ANSWER}`: templates that check alternation (llama.cpp's Mistral ones)
  skip tool messages and would otherwise see two user turns in a row.
- A `function_call_output` is omnigent's own item: it goes as
  `{type, call_id, output}` only. Its stored status (`interrupted`,
  `cancelled`, `not_run`) is not an API status; its output text says it.

The rules are pure functions over plain dicts, unit tested directly and
over a store of the previous release. `Histories` applies them
incrementally, so a model step costs what is new since the last one, not
the conversation's length (below).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from protocol.history import ZERO
from protocol.history import chain as history_chain

# What omnigent adds to an item; never part of what an endpoint returned.
OMNIGENT_FIELDS = frozenset({"response_id", "created_at", "turn_id"})
_PLAIN_ROLES = ("user", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text", "text")


NOT_RUN_FAILED = "not run: the turn failed"
NO_ANSWER = "(no answer: the turn ended after these tool results)"


def build_history(items: Iterable[dict[str, Any]], input_item_id: str | None,
                  turn_id: str | None = None, *, turn_items: Collection[str] | None = None) -> list[dict[str, Any]]:
    """The model's input for the turn whose user message is `input_item_id` (None: all items).

    `turn_items` are the ids of the items the turn's steps stored
    (`Store.list_turn_items`): those stored after its message come too, and
    nothing else stored after it. Without it but with `turn_id` (items that
    carry their turn, as in tests), the items after the message up to the
    next user message come, but for those that carry another `turn_id`."""
    return closed(answered(well_formed(clean_item(item) for item in select(items, input_item_id, turn_id,
                                                                           turn_items))))


def select(items: Iterable[dict[str, Any]], input_item_id: str | None, turn_id: str | None = None,
           turn_items: Collection[str] | None = None) -> list[dict[str, Any]]:
    """The stored items a turn's history is built from, in order (see `build_history`)."""
    upto = []
    items = iter(items)
    for item in items:
        upto.append(item)
        if item.get("id") == input_item_id:
            break
    if input_item_id is None:
        return upto
    if turn_items is not None:
        upto.extend(item for item in items if item.get("id") in turn_items)
    elif turn_id is not None:
        for item in items:
            if _is_user(item):
                break
            if item.get("turn_id", turn_id) == turn_id:
                upto.append(item)
    return upto


def clean_item(item: dict[str, Any]) -> dict[str, Any] | None:
    """One stored item in the API's own shape, or None when it must not be sent."""
    kind = item.get("type") or ("message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        if role in _PLAIN_ROLES:
            return {"role": role, "content": item.get("content")}
        if role == "assistant" and not message_text(item).strip():
            return None
    elif kind == "reasoning" and not item.get("encrypted_content"):
        return None
    elif kind == "function_call_output":
        return {"type": kind, "call_id": item.get("call_id"), "output": item.get("output")}
    elif kind is None:
        return None
    return {k: v for k, v in item.items() if k not in OMNIGENT_FIELDS}


def answered(items: list[dict[str, Any]], calls: Collection[Any] = (),
             outputs: Collection[Any] = ()) -> list[dict[str, Any]]:
    """Every function_call followed (after its step's calls) by an output; outputs without a call dropped.

    `calls` and `outputs`: call ids of the items before these (`Histories`' settled part)."""
    outputs = {i.get("call_id") for i in items if i.get("type") == "function_call_output"}.union(outputs)
    calls = {i.get("call_id") for i in items if i.get("type") == "function_call"}.union(calls)
    out: list[dict[str, Any]] = []
    unanswered: list[str] = []
    for item in items:
        kind = item.get("type")
        if kind != "function_call" and unanswered:  # the step's calls end here
            out.extend(_synthetic(call_id) for call_id in unanswered)
            unanswered = []
        if kind == "function_call_output" and item.get("call_id") not in calls:
            continue
        out.append(item)
        if kind == "function_call" and item.get("call_id") not in outputs:
            unanswered.append(item.get("call_id"))
    out.extend(_synthetic(call_id) for call_id in unanswered)
    return out


def closed(items: list[dict[str, Any]], before: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """An assistant message between tool results and a user message that follows them directly.

    `before`: the item sent before these, if any."""
    out: list[dict[str, Any]] = []
    last = before
    for item in items:
        if _is_user(item) and last is not None and last.get("type") == "function_call_output":
            out.append({"type": "message", "role": "assistant", "content": NO_ANSWER})
        out.append(item)
        last = item
    return out


def _synthetic(call_id: str | None) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": NOT_RUN_FAILED}


def well_formed(items: Iterable[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """Drop the Nones and merge each unanswered user message into the user message after it."""
    out: list[dict[str, Any]] = []
    for item in items:
        if item is None:
            continue
        if _is_user(item) and out and _is_user(out[-1]):
            out[-1] = {"role": "user", "content": merge_content(out[-1].get("content"), item.get("content"))}
        else:
            out.append(item)
    return out


def merge_content(first: Any, second: Any) -> Any:
    """Two user messages' content as one: plain text joined by a blank line, else parts concatenated."""
    a, b = _parts(first), _parts(second)
    if all(_is_text_part(p) for p in a + b):
        texts = [t for t in (_parts_text(a), _parts_text(b)) if t]
        return [{"type": "input_text", "text": "\n\n".join(texts)}]
    return a + b


def message_text(item: dict[str, Any]) -> str:
    return _parts_text(_parts(item.get("content")))


def _is_user(item: dict[str, Any]) -> bool:
    return item.get("role") == "user" and item.get("type", "message") == "message"


def _parts(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    return list(content) if isinstance(content, list) else []


def _is_text_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str)


def _parts_text(parts: list[Any]) -> str:
    return "".join(p["text"] for p in parts if _is_text_part(p))


# --- incrementally: what each model step costs is what is new since the last -----------------

# What the settled parts of all sessions may hold together (estimated, see `_cost`).
MAX_MEMO_BYTES = 64 * 1024 * 1024


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

    def build(self, store: Any, session_id: str, input_item_id: str | None, turn_id: str | None) -> Built:
        """The history of the model step of `turn_id` (its user message `input_item_id`), from `store`."""
        memo = self._read(store, session_id)
        turn_items = {i["id"] for i in store.list_turn_items(session_id, turn_id)} if turn_id else set()
        end = memo.positions.get(input_item_id) if input_item_id is not None else len(memo.ids) - 1
        if end is None or any(memo.ids[pos] not in turn_items for pos in range(end + 1, memo.settled_pos)):
            return self._from_scratch(store, session_id, input_item_id, turn_id, turn_items)
        base = memo.settled_pos
        chosen = [(pos, item) for pos, item in enumerate(memo.tail, base) if pos <= end or item["id"] in turn_items]
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
            if not pending and not _is_user(item):
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
