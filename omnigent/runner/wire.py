"""The turn's history as each harness's request wants it.

The server already sends a well-formed conversation in the Responses API's
own item shapes (`omnigent/server/history.py`: user messages as
`{role, content}`, output items as the endpoint returned them, unanswered
user messages merged). This module only converts:

- `normalize_input`: Responses API input. Items pass through as received;
  omnigent's own fields are dropped again here (a defensive no-op for a
  current server) so nothing omnigent-specific can reach a provider.
- `chat_messages`: Chat Completions messages, role + plain text. Items with no
  chat form (function calls, reasoning) are left out, and what remains is
  made to alternate again: consecutive messages of one role are joined, and
  an assistant message with no text is dropped, because leaving items out
  can make two user messages meet.
"""

from __future__ import annotations

from typing import Any

_TEXT_PARTS = ("input_text", "output_text", "text")
_OMNIGENT_FIELDS = ("response_id", "created_at", "turn_id")
_CHAT_ROLES = ("user", "assistant", "system", "developer")


def normalize_input(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history as Responses API input: the items as received, without omnigent's fields."""
    return [{k: v for k, v in item.items() if k not in _OMNIGENT_FIELDS} for item in items]


def chat_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The history as chat messages: role + plain text, alternating user and assistant."""
    messages = [{"role": "system", "content": instructions}] if instructions else []
    for item in items:
        if item.get("type", "message") != "message":
            continue
        role = item.get("role")
        if role not in _CHAT_ROLES:
            continue
        # "developer" is not understood by every OpenAI-compatible server
        role = "system" if role == "developer" else role
        content = item.get("content")
        if isinstance(content, list):
            content = "".join(
                part.get("text") or "" for part in content
                if isinstance(part, dict) and part.get("type") in _TEXT_PARTS
            )
        elif not isinstance(content, str):
            continue
        if role == "assistant" and not content.strip():
            continue
        last = messages[-1] if messages else None
        if last is not None and last["role"] == role and role != "system":
            last["content"] = "\n\n".join(t for t in (last["content"], content) if t)
        else:
            messages.append({"role": role, "content": content})
    return messages
