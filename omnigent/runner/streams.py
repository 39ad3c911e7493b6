"""Reading one streamed model answer, per harness, into events and a terminal frame.

`respond` (Responses API, harness "openai-agents") and `chat` (Chat
Completions, harness "openai-chat") make the request, relay text deltas and
finished items through `emit` as they come, and return the turn's terminal
frame. Output items are kept exactly as the endpoint returned them (with
their `id`), so they can be stored and sent back unchanged.

Tools: when the turn's session has a workspace, the agent's tools are
offered (`wire.responses_tools` / `wire.chat_tools` over
`omnigent.tools.definitions`); without one, none are, and the instructions
say why (`wire.NO_WORKSPACE`). The model's calls come back in the terminal
frame's `output` as Responses `function_call` items, whichever the harness:
Responses returns them so; chat's `tool_calls` deltas are assembled by index
(`_ToolCalls`) into the same shape, so the store holds one. The request is a
pure function of the TurnStart (no ids, no clock), so a model step sent again
after a crash sends the same bytes.

The terminal frame of a Responses stream goes through `emit` as soon as its
terminal event (`response.completed`, `.incomplete`, `.failed`, `error`) is
read, before the rest of the stream: the end of the HTTP body comes in a
later read (~0.4 ms on a local model server, a round of TLS records on a
remote one), and the answer need not wait for it. The stream is still read
to its end and closed, so its connection goes back to the pool; `respond`
then returns the same frame. Nothing is emitted after it.

A stream that ends early is told apart by whether output had begun:
- before any output, the failure is raised (`EmptyStream` for a stream that
  simply ended, the transport error otherwise) so `retry` may try again;
- after output began, the turn fails with `stream_dropped`, "the model's
  stream ended after N characters", and carries the partial answer as an
  `incomplete` message, which the server stores.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2
import openai
import trio

from protocol import TurnCompleted, TurnEvent, TurnFailed, TurnStart
from protocol import events as ev

from ._log import one_line
from .wire import chat_messages, chat_tools, create_chat, create_response, instructions_for, normalize_input, responses_tools

Terminal = TurnCompleted | TurnFailed
Emit = Callable[[TurnEvent | Terminal], Awaitable[None]]  # a terminal only last (`respond`)

STREAM_DROPPED = "stream_dropped"
# Errors that mean the connection broke, as opposed to the server saying no.
_BROKEN = (httpx2.TransportError, openai.APIConnectionError)


class EmptyStream(Exception):
    """The stream ended before any output and before its terminal event."""


def reasoning_effort(turn: TurnStart) -> str | None:
    return turn.reasoning_effort or turn.agent.get("reasoning_effort") or None


def model_name(turn: TurnStart) -> str:
    # Exactly as given: mock queues and providers key on it (reference §6.2).
    return turn.model or turn.agent.get("model") or ""


def tool_names(turn: TurnStart) -> list[str]:
    """The tools the agent wants (whether they can be offered depends on the workspace)."""
    names = turn.agent.get("tools")
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def offered_tools(turn: TurnStart) -> list[dict[str, Any]]:
    """The neutral definitions of the tools offered in this model step: none without a workspace."""
    names = tool_names(turn)
    if not names or turn.workspace is None:
        return []
    return _definitions(names)


def _definitions(names: list[str]) -> list[dict[str, Any]]:
    from omnigent.tools import definitions  # the runner alone imports the tools package (light)

    return definitions(names)


def instructions(turn: TurnStart) -> str | None:
    return instructions_for(turn.agent.get("instructions"), bool(tool_names(turn)), turn.workspace)


class _Answer:
    """What one attempt has streamed so far: the text and the item it belongs to."""

    def __init__(self, turn: TurnStart, emit: Emit) -> None:
        self.turn, self._emit = turn, emit
        self.parts: list[str] = []
        self.item_id: str | None = None  # the endpoint's id of the message being streamed
        self.done: list[dict[str, Any]] = []
        self.started = False

    async def delta(self, text: str) -> None:
        self.started = True
        self.parts.append(text)
        await self._emit(_event(self.turn, ev.TEXT_DELTA, delta=text))

    async def item_done(self, item: dict[str, Any]) -> None:
        self.started = True
        self.done.append(item)
        if item.get("type") == "message":
            self.parts.clear()
            self.item_id = None
        await self._emit(_event(self.turn, ev.ITEM_DONE, item=item))

    def dropped(self, received: int) -> TurnFailed:
        """The turn's end when the stream broke off after output began: partial answer kept."""
        output = list(self.done)
        if self.parts:
            output.append({
                "id": self.item_id or f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
                "status": "incomplete",
                "content": [{"type": "output_text", "text": "".join(self.parts), "annotations": []}],
            })
        return TurnFailed(self.turn.turn_id, STREAM_DROPPED,
                          f"the model's stream ended after {received} characters", output)


# --- harness "openai-agents": the Responses API ------------------------------


async def respond(client: openai.AsyncOpenAI, turn: TurnStart, emit: Emit) -> Terminal:
    kwargs: dict[str, Any] = {"model": model_name(turn), "input": normalize_input(turn.input), "stream": True}
    text = instructions(turn)
    if text:
        kwargs["instructions"] = text
    effort = reasoning_effort(turn)
    if effort:
        kwargs["reasoning"] = {"effort": effort}
    tools = offered_tools(turn)
    if tools:
        kwargs["tools"] = responses_tools(tools)
    stream = await create_response(client, kwargs)  # wire.py: the body from cached bytes
    answer = _Answer(turn, emit)
    received = 0
    terminal: Terminal | None = None
    try:
        async for event in stream:  # plain dicts (wire.create_response)
            kind = event.get("type")
            if terminal is not None:
                # Read to the end (the terminal event is the last one anyway):
                # leaving early hands openai's generators to the GC (G5).
                continue
            if kind == ev.TEXT_DELTA:
                delta = event.get("delta")
                if not isinstance(delta, str):
                    continue
                received += len(delta)
                answer.item_id = answer.item_id or _str(event.get("item_id"))
                await answer.delta(delta)
            elif kind == "response.output_item.added" and _field(event.get("item"), "type") == "message":
                answer.item_id = _str(_field(event.get("item"), "id"))
            elif kind == ev.ITEM_DONE and isinstance(event.get("item"), dict):
                await answer.item_done(_without_nulls(event["item"]))
            elif kind in ("response.completed", "response.incomplete"):
                # incomplete (token limit, filter) still answered: keep what came
                response = event.get("response") if isinstance(event.get("response"), dict) else {}
                output = [_without_nulls(i) for i in response.get("output") or [] if isinstance(i, dict)]
                usage = response.get("usage")
                terminal = TurnCompleted(turn.turn_id, _str(response.get("id")) or f"resp_{uuid.uuid4().hex}",
                                         output or answer.done,
                                         _without_nulls(usage) if isinstance(usage, dict) else None)
            elif kind == "response.failed":
                error = _field(event.get("response"), "error")
                message = (f"{_field(error, 'code')}: {_field(error, 'message')}" if isinstance(error, dict)
                           else "response failed")
                terminal = TurnFailed(turn.turn_id, "model_error", one_line(message))
            elif kind == "error":
                code, text = event.get("code"), event.get("message")
                message = f"{code}: {text}" if code else text
                terminal = TurnFailed(turn.turn_id, "model_error", one_line(str(message or "stream error")))
            if terminal is not None:
                await emit(terminal)  # the answer goes out now; the stream's end is read after it
    except _BROKEN:
        if terminal is not None:
            return terminal
        if not answer.started:
            raise
        return answer.dropped(received)
    finally:
        await _close(stream)
    if terminal is not None:
        return terminal
    if not answer.started:
        raise EmptyStream("the model's stream ended before any output")
    return answer.dropped(received)


# --- harness "openai-chat": Chat Completions ---------------------------------


async def chat(client: openai.AsyncOpenAI, turn: TurnStart, emit: Emit) -> Terminal:
    kwargs: dict[str, Any] = {
        "model": model_name(turn),
        "messages": chat_messages(instructions(turn), turn.input),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    effort = reasoning_effort(turn)
    if effort:
        kwargs["reasoning_effort"] = effort
    tools = offered_tools(turn)
    if tools:
        kwargs["tools"] = chat_tools(tools)
    stream = await create_chat(client, kwargs)  # wire.py: chunks as plain dicts
    answer = _Answer(turn, emit)
    calls = _ToolCalls()
    received = 0
    usage = None
    finished = False
    try:
        async for chunk in stream:
            counts = chunk.get("usage")
            if isinstance(counts, dict):
                usage = {
                    "input_tokens": counts.get("prompt_tokens"),
                    "output_tokens": counts.get("completion_tokens"),
                    "total_tokens": counts.get("total_tokens"),
                }
            for choice in chunk.get("choices") or []:
                delta = _field(choice, "delta")
                text = _field(delta, "content")
                if isinstance(text, str) and text:
                    received += len(text)
                    await answer.delta(text)
                tool_calls = _field(delta, "tool_calls")
                if isinstance(tool_calls, list) and tool_calls:
                    answer.started = True
                    calls.add(tool_calls)
                finished = finished or _field(choice, "finish_reason") is not None
    except _BROKEN:
        if not answer.started:
            raise
        return answer.dropped(received)
    finally:
        await _close(stream)
    if not finished:  # every chat stream ends its choice with a finish_reason
        if not answer.started:
            raise EmptyStream("the model's stream ended before any output")
        return answer.dropped(received)
    text = "".join(answer.parts)
    item = {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    output = [item] if text else []
    if text:
        await answer.item_done(item)
    for call in calls.items():
        await answer.item_done(call)
        output.append(call)
    return TurnCompleted(turn.turn_id, f"resp_{uuid.uuid4().hex}", output, usage)


class _ToolCalls:
    """Chat `tool_calls` deltas assembled by index into Responses `function_call` items.

    A call's first delta carries its id and name, later ones pieces of its
    arguments (some servers repeat the id or send everything at once); the
    items come out in index order. A server that sends no id gets one made up
    (9 letters and digits, which every template accepts), so every call can be
    answered."""

    def __init__(self) -> None:
        self._calls: dict[int, dict[str, Any]] = {}

    def add(self, deltas: list[Any]) -> None:
        for position, delta in enumerate(deltas):
            if not isinstance(delta, dict):
                continue
            index = delta["index"] if isinstance(delta.get("index"), int) else position
            call = self._calls.setdefault(index, {"id": None, "name": "", "arguments": []})
            if delta.get("id") and not call["id"]:
                call["id"] = delta["id"]
            function = delta.get("function")
            if isinstance(function, dict):
                if function.get("name") and not call["name"]:
                    call["name"] = function["name"]
                if function.get("arguments"):
                    call["arguments"].append(function["arguments"])

    def items(self) -> list[dict[str, Any]]:
        out = []
        for index in sorted(self._calls):
            call = self._calls[index]
            # 9 letters and digits: what strict templates (Mistral's) require of a call id
            call_id = call["id"] or uuid.uuid4().hex[:9]
            out.append({"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": call["name"],
                        "arguments": "".join(call["arguments"]) or "{}", "status": "completed"})
        return out


# --- helpers -----------------------------------------------------------------


def _event(turn: TurnStart, type_: str, **fields: Any) -> TurnEvent:
    return TurnEvent(turn.turn_id, ev.make_event(type_, turn_id=turn.turn_id, **fields))


def _field(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, dict) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _without_nulls(value: Any) -> Any:
    """An endpoint's JSON without its null fields, as the SDK's `model_dump(exclude_none=True)`
    gave it: items are stored, and sent back, without them."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


async def _close(stream: Any) -> None:
    # Shielded and bounded: after a cancel the connection must still be released.
    with trio.move_on_after(1) as scope:
        scope.shield = True
        await stream.close()
