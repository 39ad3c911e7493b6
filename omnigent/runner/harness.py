"""The one model call a turn makes: harness choice, clients, retries, errors.

`execute` picks the harness (`streams.respond` for "openai-agents",
`streams.chat` for "openai-chat"), resolves credentials, and runs the call
under the model retry policy (`retry.py`): a transient failure before any
output (408/409/429/5xx, a reset connection, a timeout) is announced as a
`session.model.retry` event and tried again; anything else maps to one
TurnFailed line. Each function returns the turn's terminal frame instead of
sending it, so the caller decides what a cancelled turn says; unit tests
drive it over `httpx2.MockTransport` under trio's MockClock.

This module imports openai (about 0.5 s), so the runner imports it only after
the server has acknowledged its hello (stack-notes §5, G14).
"""

from __future__ import annotations

import os
import random
from collections.abc import Awaitable, Callable, Mapping

import httpx2
import openai

from protocol import TurnEvent, TurnFailed, TurnStart
from protocol import events as ev

from . import retry
from ._log import one_line
from .credentials import MissingCredentials, resolve
from .streams import Emit, EmptyStream, Terminal, chat, model_name, reasoning_effort, respond
from .wire import chat_messages, normalize_input

from ..config.timeline import mark
from ..config.tls import plain_http, verify_for

mark("runner.openai_imported")  # the runner/connection.py point nearest the hello (not ours to edit)

Harness = Callable[[openai.AsyncOpenAI, TurnStart, Emit], Awaitable[Terminal]]

# retry.py is the one retry policy: exactly one HTTP request per model call.
MAX_RETRIES = 0
TIMEOUT = openai.Timeout(600.0, connect=10.0)

# Status codes worth another try, and how the retry line names them.
_TRANSIENT_STATUS = {408: "request timeout", 409: "conflict", 429: "rate limited"}


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
    # Only the client: the harnesses post through it (wire.py), never through its lazy
    # `responses` / `chat.completions` resources, which would import ~60 ms more of the SDK.
    pool.get(api_key, base_url)


def _new_client(api_key: str, base_url: str | None) -> openai.AsyncOpenAI:
    # a plain-HTTP model server needs no CA bundle (config/tls.py): ~50 ms less before the hello
    http_client = (openai.DefaultAsyncHttpxClient(verify=verify_for(base_url), timeout=TIMEOUT)
                   if plain_http(base_url) else None)
    return openai.AsyncOpenAI(api_key=api_key, base_url=base_url, max_retries=MAX_RETRIES, timeout=TIMEOUT,
                              http_client=http_client)


async def execute(
    pool: ClientPool, turn: TurnStart, emit: Emit, environ: Mapping[str, str] = os.environ,
    *, rng: random.Random | None = None,
) -> Terminal:
    """Run one turn: pick the harness, resolve credentials, make the call with retries, map errors."""
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
        policy = retry.policy_from_env(environ)
    except ValueError as exc:  # omnigent run/server checked it; a hand-started runner may not have
        return TurnFailed(turn.turn_id, "config_error", one_line(exc))
    client = pool.get(api_key, base_url)
    started = done = False

    async def relay(frame: TurnEvent | Terminal) -> None:
        nonlocal started, done
        started = True
        if not isinstance(frame, TurnEvent):  # the step's end, before its stream is read to the end
            done = True
            mark(f"turn.model_done:{turn.turn_id}")
        await emit(frame)

    async def announce(step: retry.Retrying) -> None:
        await emit(TurnEvent(turn.turn_id, ev.make_event(
            ev.MODEL_RETRY, turn_id=turn.turn_id, error=step.reason, attempt=step.attempt,
            attempts=step.attempts, delay=step.delay)))

    mark(f"turn.model_call:{turn.turn_id}")
    try:
        return await retry.call_with_retries(
            lambda: harness(client, turn, relay), policy, classify=transient,
            output_started=lambda: started, notify=announce, rng=rng)
    except retry.GaveUp as exc:
        return TurnFailed(turn.turn_id, "model_error", one_line(f"{describe_error(exc.error)} ({exc.note})"))
    except (openai.OpenAIError, httpx2.HTTPError, EmptyStream) as exc:
        return TurnFailed(turn.turn_id, "model_error", describe_error(exc))
    finally:
        if not done:
            mark(f"turn.model_done:{turn.turn_id}")  # the model's answer (or failure) is known


def transient(exc: BaseException) -> retry.Transient | None:
    """Whether a failed call may be tried again (the caller checks that no output had begun)."""
    if isinstance(exc, openai.APIStatusError):
        code = exc.status_code
        if code in _TRANSIENT_STATUS or code >= 500:
            label = _TRANSIENT_STATUS.get(code) or "server error"
            return retry.Transient(f"model error {code} ({label})", _retry_after(exc.response.headers))
        return None
    if isinstance(exc, openai.APITimeoutError) or isinstance(exc, httpx2.TimeoutException):
        return retry.Transient("model error: the request timed out")
    if isinstance(exc, (openai.APIConnectionError, httpx2.TransportError)):
        return retry.Transient("model error: could not reach the model endpoint")
    if isinstance(exc, EmptyStream):
        return retry.Transient("model error: the stream ended before any output")
    return None


def _retry_after(headers: httpx2.Headers) -> float | None:
    """Seconds from `retry-after-ms` or `retry-after` (seconds or an HTTP date), if given."""
    raw = headers.get("retry-after-ms")
    if raw:
        try:
            return float(raw) / 1000
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        pass
    import email.utils
    import time

    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())  # wall clock: the header is a wall-clock date


def describe_error(exc: BaseException) -> str:
    """One line a user can act on, e.g. "Error code: 500 - mock failure"."""
    if isinstance(exc, EmptyStream):
        text = str(exc)
    elif isinstance(exc, httpx2.HTTPError):  # a transport error the SDK did not wrap
        text = f"Connection error: {exc!r}"
    elif not isinstance(exc, openai.APIError):
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


HARNESSES: dict[str, Harness] = {"openai-agents": respond, "openai-chat": chat}

__all__ = ["HARNESSES", "ClientPool", "chat", "chat_messages", "describe_error", "execute", "model_name",
           "normalize_input", "prewarm", "reasoning_effort", "respond", "transient"]
