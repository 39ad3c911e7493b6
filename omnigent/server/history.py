"""The conversation a turn sends to the model, built from the stored items.

Why it exists: many model servers (llama.cpp with Mistral-, Gemma- or
Llama-2-style chat templates) reject a conversation whose user and assistant
turns do not alternate, and the Responses API rejects omnigent's own fields
on input. The store keeps everything that happened, failed turns included;
this module turns that record into a conversation every server accepts.

The rules (the same for every harness and for items stored by any release):

- Items up to and including the turn's own user message, in order.
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

Pure functions over plain dicts: no store, no I/O, so the rules are unit
tested directly and over a store of the previous release.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# What omnigent adds to an item; never part of what an endpoint returned.
OMNIGENT_FIELDS = frozenset({"response_id", "created_at", "turn_id"})
_PLAIN_ROLES = ("user", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text", "text")


def build_history(items: Iterable[dict[str, Any]], input_item_id: str | None) -> list[dict[str, Any]]:
    """The model's input for the turn whose user message is `input_item_id` (None: all items)."""
    upto = []
    for item in items:
        upto.append(item)
        if item.get("id") == input_item_id:
            break
    return well_formed(clean_item(item) for item in upto)


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
    elif kind is None:
        return None
    return {k: v for k, v in item.items() if k not in OMNIGENT_FIELDS}


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
