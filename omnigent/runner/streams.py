"""Reading one streamed model answer, per harness, into events and a terminal frame.

`respond` (Responses API, harness "openai-agents") and `chat` (Chat
Completions, harness "openai-chat") make the request, relay text deltas and
finished items through `emit` as they come, and return the turn's terminal
frame. Output items are kept exactly as the endpoint returned them (with
their `id`), so they can be stored and sent back unchanged.

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
from .wire import chat_messages, normalize_input

Emit = Callable[[TurnEvent], Awaitable[None]]
Terminal = TurnCompleted | TurnFailed

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
    if turn.agent.get("instructions"):
        kwargs["instructions"] = turn.agent["instructions"]
    effort = reasoning_effort(turn)
    if effort:
        kwargs["reasoning"] = {"effort": effort}
    stream = await client.responses.create(**kwargs)
    answer = _Answer(turn, emit)
    received = 0
    terminal: Terminal | None = None
    try:
        async for event in stream:
            kind = event.type
            if terminal is not None:
                # Read to the end (the terminal event is the last one anyway):
                # leaving early hands openai's generators to the GC (G5).
                continue
            if kind == ev.TEXT_DELTA:
                received += len(event.delta)
                answer.item_id = answer.item_id or getattr(event, "item_id", None)
                await answer.delta(event.delta)
            elif kind == "response.output_item.added" and getattr(event.item, "type", None) == "message":
                answer.item_id = getattr(event.item, "id", None)
            elif kind == ev.ITEM_DONE:
                await answer.item_done(_dump(event.item))
            elif kind in ("response.completed", "response.incomplete"):
                # incomplete (token limit, filter) still answered: keep what came
                response = event.response
                output = [_dump(i) for i in response.output or []] or answer.done
                usage = _dump(response.usage) if response.usage is not None else None
                terminal = TurnCompleted(turn.turn_id, response.id, output, usage)
            elif kind == "response.failed":
                error = event.response.error
                message = f"{error.code}: {error.message}" if error is not None else "response failed"
                terminal = TurnFailed(turn.turn_id, "model_error", one_line(message))
            elif kind == "error":
                message = f"{event.code}: {event.message}" if event.code else event.message
                terminal = TurnFailed(turn.turn_id, "model_error", one_line(message or "stream error"))
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
        "messages": chat_messages(turn.agent.get("instructions"), turn.input),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    effort = reasoning_effort(turn)
    if effort:
        kwargs["reasoning_effort"] = effort
    stream = await client.chat.completions.create(**kwargs)
    answer = _Answer(turn, emit)
    received = 0
    usage = None
    finished = False
    try:
        async for chunk in stream:
            if chunk.usage is not None:
                usage = {
                    "input_tokens": chunk.usage.prompt_tokens,
                    "output_tokens": chunk.usage.completion_tokens,
                    "total_tokens": chunk.usage.total_tokens,
                }
            for choice in chunk.choices or []:
                delta = choice.delta.content if choice.delta is not None else None
                if delta:
                    received += len(delta)
                    await answer.delta(delta)
                finished = finished or choice.finish_reason is not None
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
    if text:
        await answer.item_done(item)
    return TurnCompleted(turn.turn_id, f"resp_{uuid.uuid4().hex}", [item] if text else [], usage)


# --- helpers -----------------------------------------------------------------


def _event(turn: TurnStart, type_: str, **fields: Any) -> TurnEvent:
    return TurnEvent(turn.turn_id, ev.make_event(type_, turn_id=turn.turn_id, **fields))


def _dump(model: Any) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude_none=True)


async def _close(stream: Any) -> None:
    # Shielded and bounded: after a cancel the connection must still be released.
    with trio.move_on_after(1) as scope:
        scope.shield = True
        await stream.close()
