"""Wire payloads of the mock LLM: Responses/chat JSON bodies and SSE frames.

Separate from the HTTP layer so the shapes the official `openai` SDK must
parse sit in one place. Field sets follow the SDK's pydantic models
(`openai.types.responses.*`, `openai.types.chat.*`): the SDK builds models
without validation, so a missing required field would not fail loudly in the
SDK but would break a client that validates; the tests validate strictly.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

from omnigent.testing.mock_llm_state import DEFAULT_TEXT

INPUT_TOKENS = 10

# One delta per word, each carrying the whitespace that follows it, so the
# deltas concatenate to exactly the final text (the original sent
# `word + " "`, which leaves a trailing space on the concatenation).
_WORD_PIECES = re.compile(r"\s*\S+\s*")


def _new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def entry_text(entry: dict[str, Any]) -> str | None:
    """The assistant text of an entry; None when it only makes tool calls/items."""
    text = entry.get("text")
    if isinstance(text, str):
        return text
    if entry.get("tool_calls") or entry.get("native_items"):
        return None
    # e.g. a bare {"block": true} entry still has to answer something.
    return DEFAULT_TEXT


def output_tokens(text: str | None) -> int:
    return max(5, len((text or "").split()))


def error_body(entry: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The JSON error and status for an `error` entry."""
    error = entry.get("error")
    if isinstance(error, str):
        message = error
    elif isinstance(entry.get("text"), str):
        message = entry["text"]
    else:
        message = "Mock LLM error"
    status = entry.get("status_code") or 500
    return {"error": {"message": message, "type": "mock_error"}}, status


def _arguments(raw: Any) -> str:
    # Both APIs carry arguments as a JSON string; scripts may give an object.
    if raw is None:
        return "{}"
    if isinstance(raw, str):
        return raw
    return json.dumps(raw)


# -- Responses API -------------------------------------------------------


def _message_item(text: str, *, done: bool) -> dict[str, Any]:
    return {
        "id": _new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "status": "completed" if done else "in_progress",
        "content": [_output_text(text)] if done else [],
    }


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _function_call_item(call: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": _new_id("fc_"),
        "type": "function_call",
        "call_id": call.get("call_id") or call.get("id") or _new_id("call_"),
        "name": call["name"],
        "arguments": _arguments(call.get("arguments")),
        "status": "completed",
    }


def output_items(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The completed output items for an entry: native items, message, calls."""
    items: list[dict[str, Any]] = [dict(item) for item in entry.get("native_items") or []]
    text = entry_text(entry)
    if text is not None:
        items.append(_message_item(text, done=True))
    items.extend(_function_call_item(call) for call in entry.get("tool_calls") or [])
    return items


def response_object(
    *,
    response_id: str,
    model: str,
    created_at: int,
    output: list[dict[str, Any]],
    text: str | None,
    completed: bool,
) -> dict[str, Any]:
    """A Responses API `Response` object (in progress or completed)."""
    usage = None
    if completed:
        out = output_tokens(text)
        usage = {
            "input_tokens": INPUT_TOKENS,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": out,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": INPUT_TOKENS + out,
        }
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "completed_at": int(time.time()) if completed else None,
        "status": "completed" if completed else "in_progress",
        "model": model,
        "output": output,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "temperature": None,
        "top_p": None,
        "tool_choice": "auto",
        "tools": [],
        "text": {"format": {"type": "text"}},
        "usage": usage,
    }


def response_json(entry: dict[str, Any], model: str) -> dict[str, Any]:
    """The non-streaming `POST /v1/responses` body."""
    return response_object(
        response_id=_new_id("resp_"),
        model=model,
        created_at=int(time.time()),
        output=output_items(entry),
        text=entry_text(entry),
        completed=True,
    )


def _frame(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


def is_text_delta(frame: str) -> bool:
    """Whether an SSE frame of `response_sse_frames` is a text delta (what `--token-ms` paces)."""
    return frame.startswith("event: response.output_text.delta\n")


def dropped_response_sse(entry: dict[str, Any], model: str) -> str:
    """The frames a streamed Responses answer sends before its connection drops.

    `drop_after` is how many characters of the text arrive (as deltas) first:
    response.created, output_item.added, then text deltas up to that many
    characters, and nothing after (no done, no response.completed).
    """
    text = entry_text(entry) or ""
    sent = text[: entry["drop_after"]]
    response_id = _new_id("resp_")
    item = _message_item(sent, done=False)
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response_object(
            response_id=response_id, model=model, created_at=int(time.time()), output=[], text=None,
            completed=False)},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
    ]
    place = {"item_id": item["id"], "output_index": 0, "content_index": 0}
    events += [{"type": "response.output_text.delta", "delta": piece, "logprobs": [], **place}
               for piece in _WORD_PIECES.findall(sent)]
    return "".join(_frame({**event, "sequence_number": n}) for n, event in enumerate(events))


def dropped_chat_sse(entry: dict[str, Any], model: str) -> str:
    """The chunks a streamed chat answer sends before its connection drops: `drop_after` characters, no finish."""
    sent = (_chat_text(entry) or "")[: entry["drop_after"]]
    if not sent:
        return ""
    chunk = {"id": _new_id("chatcmpl-"), "object": "chat.completion.chunk", "created": int(time.time()),
             "model": model, "choices": [{"index": 0, "delta": {"role": "assistant", "content": sent},
                                          "finish_reason": None, "logprobs": None}]}
    return f"data: {json.dumps(chunk)}\n\n"


def response_sse(entry: dict[str, Any], model: str) -> str:
    """The streaming `POST /v1/responses` body, all frames in one string (`response_sse_frames`)."""
    return "".join(response_sse_frames(entry, model))


def response_sse_frames(entry: dict[str, Any], model: str) -> list[str]:
    """The streaming `POST /v1/responses` body, one SSE frame per event.

    Sequence: response.created, then per output item output_item.added,
    [output_text.delta per word when the entry has "stream": true,]
    output_text.done (or function_call_arguments.delta/done), output_item.done,
    and finally response.completed carrying the full response and usage.
    """
    response_id = _new_id("resp_")
    created_at = int(time.time())
    text = entry_text(entry)
    items = output_items(entry)
    events: list[dict[str, Any]] = []

    def emit(event_type: str, **fields: Any) -> None:
        events.append({"type": event_type, "sequence_number": len(events), **fields})

    emit(
        "response.created",
        response=response_object(
            response_id=response_id, model=model, created_at=created_at,
            output=[], text=text, completed=False,
        ),
    )
    for index, item in enumerate(items):
        if item.get("type") == "message":
            item_text = item["content"][0]["text"]
            emit("response.output_item.added", output_index=index,
                 item={**item, "status": "in_progress", "content": []})
            place = {"item_id": item["id"], "output_index": index, "content_index": 0}
            if entry.get("stream"):
                for piece in _WORD_PIECES.findall(item_text):
                    emit("response.output_text.delta", delta=piece, logprobs=[], **place)
            emit("response.output_text.done", text=item_text, logprobs=[], **place)
        elif item.get("type") == "function_call":
            emit("response.output_item.added", output_index=index,
                 item={**item, "status": "in_progress", "arguments": ""})
            place = {"item_id": item["id"], "output_index": index}
            emit("response.function_call_arguments.delta", delta=item["arguments"], **place)
            emit("response.function_call_arguments.done", arguments=item["arguments"],
                 name=item["name"], **place)
        else:
            # Native items are passed through verbatim; no per-type sub-events.
            emit("response.output_item.added", output_index=index, item=item)
        emit("response.output_item.done", output_index=index, item=item)
    emit(
        "response.completed",
        response=response_object(
            response_id=response_id, model=model, created_at=created_at,
            output=items, text=text, completed=True,
        ),
    )
    return [_frame(event) for event in events]


# -- Chat Completions API ------------------------------------------------


def _chat_tool_calls(entry: dict[str, Any], *, with_index: bool) -> list[dict[str, Any]]:
    calls = []
    for index, call in enumerate(entry.get("tool_calls") or []):
        wire = {
            "id": call.get("call_id") or call.get("id") or _new_id("call_"),
            "type": "function",
            "function": {"name": call["name"], "arguments": _arguments(call.get("arguments"))},
        }
        if with_index:
            wire["index"] = index  # chunk deltas address tool calls by index
        calls.append(wire)
    return calls


def _chat_text(entry: dict[str, Any]) -> str | None:
    # native_items are a Responses-API notion; chat only sees text and calls.
    text = entry.get("text")
    if isinstance(text, str):
        return text
    return None if entry.get("tool_calls") else DEFAULT_TEXT


def chat_json(entry: dict[str, Any], model: str) -> dict[str, Any]:
    """The non-streaming `POST /v1/chat/completions` body."""
    text = _chat_text(entry)
    calls = _chat_tool_calls(entry, with_index=False)
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if calls:
        message["tool_calls"] = calls
    out = output_tokens(text)
    return {
        "id": _new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": message,
            "finish_reason": "tool_calls" if calls else "stop",
            "logprobs": None,
        }],
        "usage": {
            "prompt_tokens": INPUT_TOKENS,
            "completion_tokens": out,
            "total_tokens": INPUT_TOKENS + out,
        },
    }


def chat_sse(entry: dict[str, Any], model: str) -> str:
    """The streaming chat body: one content chunk, the tool calls in pieces, one finish chunk, [DONE]."""
    text = _chat_text(entry)
    calls = _chat_tool_calls(entry, with_index=True)
    base = {
        "id": _new_id("chatcmpl-"),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    # Tool calls arrive as real servers send them: a call's id and name first, then its
    # arguments in pieces, so a client must assemble them by index.
    chunks = [chunk({"role": "assistant", "content": text})]
    for call in calls:
        arguments = call["function"]["arguments"]
        chunks.append(chunk({"tool_calls": [{**call, "function": {**call["function"], "arguments": ""}}]}))
        half = len(arguments) // 2
        for piece in (arguments[:half], arguments[half:]):
            if piece:
                chunks.append(chunk({"tool_calls": [{"index": call["index"], "function": {"arguments": piece}}]}))
    chunks.append(chunk({}, "tool_calls" if calls else "stop"))
    return "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
