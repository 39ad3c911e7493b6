"""The one model call a turn makes, per harness, and the clients it goes through.

Pure async functions over an `AsyncOpenAI` client and an `emit` callback, so
unit tests drive them with `httpx2.MockTransport` and no sockets. Each returns
the turn's terminal frame (TurnCompleted or TurnFailed) instead of sending it,
so the caller decides what a cancelled turn says.

This module imports openai (about 0.5 s), so the runner imports it only after
the server has acknowledged its hello (stack-notes §5, G14).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx2
import openai
import trio

from protocol import TurnCompleted, TurnEvent, TurnFailed, TurnStart
from protocol import events as ev

from ._log import one_line
from .credentials import MissingCredentials, resolve

Emit = Callable[[TurnEvent], Awaitable[None]]
Terminal = TurnCompleted | TurnFailed
Harness = Callable[[openai.AsyncOpenAI, TurnStart, Emit], Awaitable[Terminal]]

# The server and supervisor own retries: exactly one model call per attempt.
MAX_RETRIES = 0
TIMEOUT = openai.Timeout(600.0, connect=10.0)

_TEXT_PARTS = ("input_text", "output_text")
_DROPPED_ITEM_FIELDS = ("id", "status", "created_at")


class ClientPool:
    """One AsyncOpenAI per (api_key, base_url), built on first use and reused.

    The first constructor costs about 120 ms and every client owns a
    connection pool, so turns share them; `aclose` must run at exit because
    an unclosed client leaks its socket under trio (G6).
    """

    def __init__(self, factory: Callable[[str, str | None], openai.AsyncOpenAI] | None = None) -> None:
        self._factory = factory or _new_client
        self._clients: dict[tuple[str, str | None], openai.AsyncOpenAI] = {}

    def get(self, api_key: str, base_url: str | None) -> openai.AsyncOpenAI:
        key = (api_key, base_url)
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = self._factory(api_key, base_url)
        return client

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()


def prewarm(pool: ClientPool, environ: Mapping[str, str] = os.environ) -> None:
    """Build the client most turns use (the environment's credentials) ahead of the first turn."""
    try:
        api_key, base_url = resolve({}, environ)
    except MissingCredentials:
        return  # turns will say so; nothing to warm
    client = pool.get(api_key, base_url)
    client.responses, client.chat.completions  # lazily imported resources


def _new_client(api_key: str, base_url: str | None) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key=api_key, base_url=base_url, max_retries=MAX_RETRIES, timeout=TIMEOUT)


async def execute(
    pool: ClientPool, turn: TurnStart, emit: Emit, environ: Mapping[str, str] = os.environ
) -> Terminal:
    """Run one turn: pick the harness, resolve credentials, make the call, map errors."""
    name = turn.agent.get("harness") or "openai-agents"
    harness = HARNESSES.get(name)
    if harness is None:
        supported = ", ".join(HARNESSES)
        return TurnFailed(turn.turn_id, "unsupported_harness",
                          f"harness {name!r} is not supported by this runner (supported: {supported})")
    try:
        api_key, base_url = resolve(turn.agent, environ)
    except MissingCredentials as exc:
        return TurnFailed(turn.turn_id, "auth_missing", one_line(exc))
    try:
        return await harness(pool.get(api_key, base_url), turn, emit)
    except openai.OpenAIError as exc:
        return TurnFailed(turn.turn_id, "model_error", describe_error(exc))
    except httpx2.HTTPError as exc:  # a transport error the SDK did not wrap
        return TurnFailed(turn.turn_id, "model_error", one_line(f"Connection error: {exc!r}"))


def describe_error(exc: openai.OpenAIError) -> str:
    """One line a user can act on, e.g. "Error code: 500 - mock failure"."""
    if not isinstance(exc, openai.APIError):
        text = str(exc) or type(exc).__name__
    elif isinstance(exc, openai.APITimeoutError):
        text = f"Request timed out: no answer from {_url(exc)}"
    elif isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        detail = f" ({cause})" if cause is not None and str(cause) else ""
        text = f"Connection error: could not reach {_url(exc)}{detail}"
    elif isinstance(exc, openai.APIStatusError):
        body = exc.body
        message = body.get("message") if isinstance(body, dict) else None
        if not isinstance(message, str) or not message:
            message = body if isinstance(body, str) and body else exc.response.reason_phrase
        text = f"Error code: {exc.status_code} - {message}"
    else:
        text = exc.message or type(exc).__name__
    return one_line(text)


def _url(exc: openai.APIError) -> str:
    try:
        return str(exc.request.url)
    except Exception:  # a request-less error still deserves a message
        return "the model endpoint"


def reasoning_effort(turn: TurnStart) -> str | None:
    return turn.reasoning_effort or turn.agent.get("reasoning_effort") or None


def model_name(turn: TurnStart) -> str:
    # Exactly as given: mock queues and providers key on it (reference §6.2).
    return turn.model or turn.agent.get("model") or ""


# --- harness "openai-agents": the Responses API ------------------------------


def normalize_input(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history as the Responses API accepts it back as input.

    Stored items carry ids, statuses and timestamps the API rejects on input,
    and a message's text parts must be `input_text` for user/system turns and
    `output_text` for the assistant's own.
    """
    out = []
    for item in items:
        kind = item.get("type", "message" if "role" in item else None)
        if kind != "message":
            out.append({k: v for k, v in item.items() if k not in _DROPPED_ITEM_FIELDS})
            continue
        role = item.get("role")
        content = item.get("content")
        if isinstance(content, list):
            text_type = "output_text" if role == "assistant" else "input_text"
            content = [
                {"type": text_type, "text": part.get("text") or ""}
                if isinstance(part, dict) and part.get("type") in _TEXT_PARTS else part
                for part in content
            ]
        out.append({"type": "message", "role": role, "content": content})
    return out


async def respond(client: openai.AsyncOpenAI, turn: TurnStart, emit: Emit) -> Terminal:
    kwargs: dict[str, Any] = {"model": model_name(turn), "input": normalize_input(turn.input), "stream": True}
    if turn.agent.get("instructions"):
        kwargs["instructions"] = turn.agent["instructions"]
    effort = reasoning_effort(turn)
    if effort:
        kwargs["reasoning"] = {"effort": effort}
    stream = await client.responses.create(**kwargs)
    done_items: list[dict[str, Any]] = []
    terminal: Terminal | None = None
    try:
        async for event in stream:
            kind = event.type
            if terminal is not None:
                # Read to the end (the terminal event is the last one anyway):
                # leaving early hands openai's generators to the GC (G5).
                continue
            if kind == ev.TEXT_DELTA:
                await emit(_event(turn, ev.TEXT_DELTA, delta=event.delta))
            elif kind == ev.ITEM_DONE:
                item = _dump(event.item)
                done_items.append(item)
                await emit(_event(turn, ev.ITEM_DONE, item=item))
            elif kind in ("response.completed", "response.incomplete"):
                # incomplete (token limit, filter) still answered: keep what came
                response = event.response
                output = [_dump(i) for i in response.output or []] or done_items
                usage = _dump(response.usage) if response.usage is not None else None
                terminal = TurnCompleted(turn.turn_id, response.id, output, usage)
            elif kind == "response.failed":
                error = event.response.error
                message = f"{error.code}: {error.message}" if error is not None else "response failed"
                terminal = TurnFailed(turn.turn_id, "model_error", one_line(message))
            elif kind == "error":
                message = f"{event.code}: {event.message}" if event.code else event.message
                terminal = TurnFailed(turn.turn_id, "model_error", one_line(message or "stream error"))
    finally:
        await _close(stream)
    if terminal is not None:
        return terminal
    return TurnFailed(turn.turn_id, "model_error", "the model stream ended before response.completed")


# --- harness "openai-chat": Chat Completions ---------------------------------


def chat_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The history as chat messages: role + plain text; non-message items have no chat form."""
    messages = [{"role": "system", "content": instructions}] if instructions else []
    for item in items:
        if item.get("type", "message") != "message":
            continue
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            continue
        content = item.get("content")
        if isinstance(content, list):
            content = "".join(
                part.get("text") or "" for part in content
                if isinstance(part, dict) and part.get("type") in _TEXT_PARTS
            )
        elif not isinstance(content, str):
            continue
        # "developer" is not understood by every OpenAI-compatible server
        messages.append({"role": "system" if role == "developer" else role, "content": content})
    return messages


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
    parts: list[str] = []
    usage = None
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
                    parts.append(delta)
                    await emit(_event(turn, ev.TEXT_DELTA, delta=delta))
    finally:
        await _close(stream)
    item = {
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "".join(parts)}],
    }
    await emit(_event(turn, ev.ITEM_DONE, item=item))
    return TurnCompleted(turn.turn_id, f"resp_{uuid.uuid4().hex}", [item], usage)


HARNESSES: dict[str, Harness] = {"openai-agents": respond, "openai-chat": chat}


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
