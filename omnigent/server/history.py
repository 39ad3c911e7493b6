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
over a store of the previous release. `histories.Histories` applies them
incrementally, so a model step costs what is new since the last one, not
the conversation's length.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

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
            if is_user(item):
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
    unanswered: list[Any] = []  # call ids as the items carry them
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
        if is_user(item) and last is not None and last.get("type") == "function_call_output":
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
        if is_user(item) and out and is_user(out[-1]):
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


def is_user(item: dict[str, Any]) -> bool:
    return item.get("role") == "user" and item.get("type", "message") == "message"


def _parts(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    return list(content) if isinstance(content, list) else []


def _is_text_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str)


def _parts_text(parts: list[Any]) -> str:
    return "".join(p["text"] for p in parts if _is_text_part(p))

