"""The turn's history, and the tools offered, as each harness's request wants them.

The server already sends a well-formed conversation in the Responses API's
own item shapes (`omnigent/server/history.py`: user messages as
`{role, content}`, output items as the endpoint returned them, unanswered
user messages merged, every `function_call` followed by its
`function_call_output`). This module only converts:

- `normalize_input`: Responses API input. Items pass through as received;
  omnigent's own fields are dropped again here (a defensive no-op for a
  current server) so nothing omnigent-specific can reach a provider.
- `chat_messages`: Chat Completions messages. Messages become role + plain
  text; a run of assistant output (text and `function_call` items of one
  step) becomes one assistant message with `tool_calls` (its text in
  `content`, None when it has none: such a message is kept, it is not
  empty); a `function_call_output` becomes a `role: tool` message. Items with
  no chat form (reasoning) are left out, and what remains is made to
  alternate again: consecutive messages of one role are joined, and an
  assistant message with neither text nor calls is dropped, because leaving
  items out can make two user messages meet. A call without an output, or an
  output without its call, is left out too: chat servers refuse either, and
  the server's history never sends one.
- `responses_tools` / `chat_tools`: the neutral tool definitions
  (`omnigent.tools.definitions`) in each API's shape, built the same way
  every time so a repeated model step sends a byte-identical body.
- `create_response`: the Responses request, through the openai client, with
  its JSON body written here: the bytes the SDK itself would write (same
  key order, same JSON settings; a unit test compares them), but the input
  items spliced in as bytes already encoded (`EncodedItems`, kept per
  session by `history_cache.py`), so a long history costs a join, not the
  SDK's per-item transform and encoding. Its events come back as plain dicts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protocol.history import item_bytes

_TEXT_PARTS = ("input_text", "output_text", "text")
_OMNIGENT_FIELDS = ("response_id", "created_at", "turn_id")
_CHAT_ROLES = ("user", "assistant", "system", "developer")

# What a model is told when the agent has tools but the session has no workspace
# (sessions created through the API before workspaces existed).
NO_WORKSPACE = "This session has no workspace, so file and shell tools are not available."


class EncodedItems(list):  # type: ignore[type-arg]
    """Responses input items (normalized already) with their request bytes, comma-separated
    (`protocol.history.item_bytes` each): the body's input array but for its brackets.

    The bytes are the first `length` of `joined`, a buffer the history cache goes on
    appending to (which leaves them as they are); `unchanged()` says whether they still are
    (a truncation since would not), else they are encoded again from the items."""

    def __init__(self, items: list[dict[str, Any]], joined: bytes | bytearray, length: int | None = None,
                 unchanged: Callable[[], bool] | None = None) -> None:
        super().__init__(items)
        self._joined = joined
        self._length = len(joined) if length is None else length
        self._unchanged = unchanged

    def joined(self) -> bytes | memoryview:
        """The items' bytes, comma-separated; a view into the cache's buffer: use it at once."""
        if self._unchanged is not None and not self._unchanged():
            return b",".join(item_bytes(i) for i in self)
        return memoryview(self._joined)[:self._length]


def normalize_input(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history as Responses API input: the items as received, without omnigent's fields."""
    if isinstance(items, EncodedItems):
        return items  # normalized when it was cached
    return [normalize_item(item) for item in items]


def normalize_item(item: dict[str, Any]) -> dict[str, Any]:
    if not any(k in item for k in _OMNIGENT_FIELDS):
        return item
    return {k: v for k, v in item.items() if k not in _OMNIGENT_FIELDS}


# The order `openai.resources.responses.AsyncResponses.create` builds its body in, for the keys
# the harness passes (any other key: the SDK's own call).
_RESPONSES_ORDER = ("model", "stream", "input", "instructions", "reasoning", "tools")


def responses_body(kwargs: dict[str, Any]) -> bytes:
    """The JSON body `client.responses.create(**kwargs)` sends, with the input items' bytes joined in."""
    items = kwargs["input"]
    joined = items.joined() if isinstance(items, EncodedItems) else b",".join(item_bytes(i) for i in items)
    pieces: list[bytes | memoryview] = [b"{"]  # joined once: the items' bytes are copied a single time
    for key in _RESPONSES_ORDER:
        if key not in kwargs:
            continue
        if len(pieces) > 1:
            pieces.append(b",")
        pieces.append(item_bytes(key) + b":")
        pieces.extend((b"[", joined, b"]") if key == "input" else (item_bytes(kwargs[key]),))
    pieces.append(b"}")
    return b"".join(pieces)


async def create_response(client: Any, kwargs: dict[str, Any]) -> Any:
    """`client.responses.create(**kwargs)` (streaming), the body written by `responses_body`.

    The stream yields each event as the plain dict the endpoint sent (openai's own SSE
    decoding and error handling, `cast_to=object`), not as openai's typed event models:
    validating every event against the SDK's union of 50-odd pydantic models was a fifth
    of a runner's CPU per turn, and the runner reads four fields of them.
    """
    from openai import AsyncStream
    from openai._base_client import make_request_options

    options = make_request_options(security={"bearer_auth": True})
    if set(kwargs) - set(_RESPONSES_ORDER) or kwargs.get("stream") is not True:
        return await client.post("/responses", body=kwargs, cast_to=object, stream=kwargs.get("stream") is True,
                                 stream_cls=AsyncStream[object], options=options)
    return await client.post("/responses", content=responses_body(kwargs), cast_to=object, stream=True,
                             stream_cls=AsyncStream[object], options=options)


async def create_chat(client: Any, kwargs: dict[str, Any]) -> Any:
    """`client.chat.completions.create(**kwargs)` (streaming), its chunks as plain dicts
    (see `create_response`)."""
    from openai import AsyncStream
    from openai._base_client import make_request_options

    return await client.post("/chat/completions", body=kwargs, cast_to=object, stream=True,
                             stream_cls=AsyncStream[object],
                             options=make_request_options(security={"bearer_auth": True}))


def responses_tools(definitions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses API `tools`: one function tool per definition, `strict` off (our schemas are loose)."""
    return [{"type": "function", "name": d["name"], "description": d["description"],
             "parameters": d["parameters"], "strict": False} for d in definitions]


def chat_tools(definitions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat Completions `tools`: `{"type": "function", "function": {...}}` per definition."""
    return [{"type": "function", "function": {"name": d["name"], "description": d["description"],
                                              "parameters": d["parameters"]}} for d in definitions]


def instructions_for(instructions: str | None, tools_wanted: bool, workspace: str | None) -> str | None:
    """The instructions sent: the spec's, plus one line when its tools cannot be offered here."""
    if not tools_wanted or workspace is not None:
        return instructions or None
    return f"{instructions.rstrip()}\n\n{NO_WORKSPACE}" if instructions and instructions.strip() else NO_WORKSPACE


def chat_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history as chat messages, alternating user and assistant, tool results after their calls."""
    answered = {i.get("call_id") for i in items if i.get("type") == "function_call_output"}
    asked = {i.get("call_id") for i in items if i.get("type") == "function_call"}
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    for item in items:
        kind = item.get("type", "message")
        if kind == "function_call":
            if item.get("call_id") in answered:
                _append_call(messages, item)
            continue
        if kind == "function_call_output":
            if item.get("call_id") in asked:
                messages.append({"role": "tool", "tool_call_id": item["call_id"],
                                 "content": _output_text(item.get("output"))})
            continue
        if kind != "message":
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


def _append_call(messages: list[dict[str, Any]], item: dict[str, Any]) -> None:
    """Add a call to the assistant message it belongs to: the last one, unless a tool or user spoke since."""
    call = {"id": item["call_id"], "type": "function",
            "function": {"name": item.get("name") or "", "arguments": item.get("arguments") or "{}"}}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        if not last["content"]:
            last["content"] = None
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _output_text(output: Any) -> str:
    # Our outputs are strings; the Responses API also allows a list of content parts.
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "".join(p.get("text") or "" for p in output if isinstance(p, dict))
    return ""
