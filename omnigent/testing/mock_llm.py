"""Scripted OpenAI-compatible mock LLM server (reference §6.2), on trio.

Why it exists: e2e tests and `omnigent mock-llm` need an LLM endpoint whose
answers are scripted per test, so agent runs are deterministic and offline.
Tests script it over HTTP (`/mock/configure` etc.) and point the real
`openai` SDK at `<url>/v1`.

Protocol summary (details in the route docstrings):

* `POST /v1/responses`, `POST /v1/chat/completions`: count and capture the
  body, pick a queue (longest `match` token found in the user text, else the
  queue keyed by the request's `model` exactly, else `"default"`), pop the
  next entry (exhausted: fallback or text "Mock LLM response"). Entry fields:
  `text`, `tool_calls` [{name, arguments, call_id?}], `native_items` (raw
  Responses output items), `stream` (per-word text deltas), `block` (park
  until released), `error` (+ `status_code`, default 500, and
  `retry_after`, sent as the `Retry-After` header), `should_retry` (bool,
  sent as the `x-should-retry` header the openai SDK obeys; without it the
  SDK retries 408/409/429/5xx up to twice, consuming further entries), and
  `drop_after` (int: a streamed answer sends that many characters of its
  text, then the connection is aborted with no terminal event).
* `GET /v1/models`, `POST /mock/configure`, `POST /mock/set_fallback`,
  `POST /mock/reset`, `GET /mock/requests?key=` (`&sha256=1` adds the
  sha256 of each body's exact bytes, so a test can tell a repeated request
  is byte-identical), `GET /stats`.
* Tool calls: Responses `function_call` items (streamed with
  `function_call_arguments.delta/done`); chat `tool_calls`, streamed as real
  servers do (id and name first, the arguments in two pieces), with
  `finish_reason: "tool_calls"`.
* Pacing (command line): `--delay-ms MS`, every model call waits MS before
  it answers; `--token-ms MS`, a streamed Responses answer sends each text
  delta MS after the one before (`create_app`).
* Gates: `GET /gate/pending` -> `{"pending": [{"gate_id", "key", "model",
  "since"}], "count": n}`; `POST /gate/release` with `{"gate_id": "gate-1"}`
  releases that gate (404 if it is not pending), with `{}` or no body
  releases every pending gate; it answers `{"released": [ids], "count": n}`.

Top-level imports are only trio and this package's plain modules: quart-trio
and hypercorn are imported where the app is built, so importing this module
(e.g. from the CLI) stays cheap (stack-notes G14).
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
from collections.abc import AsyncIterator
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import trio

from omnigent.testing import mock_llm_payloads as payloads
from omnigent.testing.mock_llm_state import DEFAULT_KEY, EntryError, MockState

if TYPE_CHECKING:
    from quart_trio import QuartTrio

FALLBACK_MODEL = "mock-model"


class BadRequest(Exception):
    """A request body the mock refuses; answered as a 400 JSON error, never a 500."""


def _require_str(body: dict[str, Any], name: str, default: str | None) -> str | None:
    value = body.get(name, default)
    if value is not None and not isinstance(value, str):
        raise BadRequest(f"{name!r} must be a string")
    return value


def create_app(delay: float = 0.0, token_delay: float = 0.0) -> QuartTrio:
    """Build a fresh mock LLM app with its own empty state.

    `delay` (seconds) is how long every model call waits before it answers,
    as a model's own time would (scripts/bench_sessions.py: a 50 ms model).
    `token_delay` (seconds), when above 0, paces a streamed Responses answer
    as a model streams its tokens: its frames up to the first text delta go at
    once, then the n-th delta n times that long after the first (the frames
    after the last delta with it), so that a client's time to the first token
    can be told from its time to the whole answer.
    """
    from quart import request
    from quart_trio import QuartTrio

    app = QuartTrio(__name__)
    state = MockState()
    app.config["MOCK_STATE"] = state  # reachable for in-process tests

    async def read_json(*, allow_empty: bool = False) -> dict[str, Any]:
        return (await read_json_raw(allow_empty=allow_empty))[0]

    async def read_json_raw(*, allow_empty: bool = False) -> tuple[dict[str, Any], bytes]:
        # Parse by hand: Quart's get_json would answer a malformed body with
        # its own HTML 400, and the protocol promises JSON errors.
        raw = cast(bytes, await request.get_data(as_text=False))
        if not raw.strip():
            if allow_empty:
                return {}, raw
            raise BadRequest("request body must be a JSON object")
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise BadRequest(f"invalid JSON body: {exc}") from None
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        return body, raw

    @app.errorhandler(BadRequest)
    @app.errorhandler(EntryError)
    async def bad_request(exc: Exception) -> tuple[dict[str, Any], int]:
        return {"error": {"message": str(exc), "type": "invalid_request_error"}}, 400

    async def llm_call(api: str) -> Any:
        body, raw = await read_json_raw()
        key, entry = state.take(body, raw)
        model: str = body["model"] if isinstance(body.get("model"), str) else FALLBACK_MODEL
        if delay > 0:
            await trio.sleep(delay)
        if entry.get("block"):
            await state.park(key, model)
        status = entry.get("status_code")
        if entry.get("error") or (isinstance(status, int) and status >= 400):
            error, status = payloads.error_body(entry)
            headers = {}
            if isinstance(entry.get("should_retry"), bool):
                headers["x-should-retry"] = "true" if entry["should_retry"] else "false"
            if entry.get("retry_after") is not None:
                headers["Retry-After"] = str(entry["retry_after"])
            return error, status, headers
        if entry.get("drop_after") is not None and body.get("stream") is True:
            build_dropped = payloads.dropped_response_sse if api == "responses" else payloads.dropped_chat_sse
            return _dropping_response(app, build_dropped(entry, model))
        if body.get("stream") is not True:
            if api == "responses":
                return payloads.response_json(entry, model)
            return payloads.chat_json(entry, model)
        if token_delay > 0 and api == "responses":
            body_out: Any = _paced(payloads.response_sse_frames(entry, model), token_delay)
        else:
            # The whole SSE body is built up front and sent in one chunk, as the
            # original did.
            build_sse = payloads.response_sse if api == "responses" else payloads.chat_sse
            body_out = build_sse(entry, model)
        return app.response_class(
            body_out, status=200, content_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

    @app.post("/v1/responses")
    async def responses() -> Any:
        """OpenAI Responses API: JSON Response, or SSE when `"stream": true`."""
        return await llm_call("responses")

    @app.post("/v1/chat/completions")
    async def chat_completions() -> Any:
        """Chat Completions: JSON, or one content chunk + finish chunk + [DONE]."""
        return await llm_call("chat")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": []}

    @app.post("/mock/configure")
    async def configure() -> dict[str, Any]:
        """`{"key"?="default", "match"?, "responses": [...]}`: replace that key's script."""
        body = await read_json()
        key = _require_str(body, "key", DEFAULT_KEY) or DEFAULT_KEY
        match = _require_str(body, "match", None)
        responses = body.get("responses", [])
        if not isinstance(responses, list):
            raise BadRequest("'responses' must be a list")
        count = state.configure(key, responses, match)
        return {"configured": True, "key": key, "count": count}

    @app.post("/mock/set_fallback")
    async def set_fallback() -> dict[str, Any]:
        """`{"key"?="default", "text", "stream"?}`: exhausted-queue answer; survives reset."""
        body = await read_json()
        key = _require_str(body, "key", DEFAULT_KEY) or DEFAULT_KEY
        text = _require_str(body, "text", None)
        if text is None:
            raise BadRequest("'text' is required")
        state.set_fallback(key, text, bool(body.get("stream", False)))
        return {"fallback_set": True, "key": key}

    @app.post("/mock/reset")
    async def reset() -> dict[str, Any]:
        """Drop scripts (fallback queues stay, emptied), captures and counter; release gates."""
        await read_json(allow_empty=True)  # a body is optional, but must be JSON if sent
        released = state.reset()
        return {"reset": True, "released": released}

    @app.get("/mock/requests")
    async def captured_requests() -> dict[str, Any]:
        """Captured LLM request bodies, oldest first; `?key=` keeps those whose model equals it;
        `?sha256=1` adds `sha256`, the digest of each body's exact bytes, in the same order."""
        found = state.captured_with_digests(request.args.get("key"))
        answer: dict[str, Any] = {"requests": [body for body, _ in found], "count": len(found)}
        if request.args.get("sha256") not in (None, "", "0"):
            answer["sha256"] = [digest for _, digest in found]
        return answer

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return {"request_count": state.request_count}

    @app.get("/gate/pending")
    async def gate_pending() -> dict[str, Any]:
        pending = state.pending()
        return {"pending": pending, "count": len(pending)}

    @app.post("/gate/release")
    async def gate_release() -> Any:
        """`{"gate_id": id}` releases one parked request; `{}`/no body releases all."""
        body = await read_json(allow_empty=True)
        gate_id = _require_str(body, "gate_id", None)
        released = state.release(gate_id)
        if gate_id is not None and not released:
            return {"error": {"message": f"no pending gate {gate_id!r}", "type": "not_found"}}, 404
        return {"released": released, "count": len(released)}

    return app


async def _paced(frames: list[str], token_delay: float) -> AsyncIterator[bytes]:
    """A streamed answer's frames as a model sends them (`create_app`'s `token_delay`): up to the first
    text delta at once, then the n-th delta `n * token_delay` after the first, with what follows it.

    At those instants, not `token_delay` after each send: a mock busy with many streams at once
    would otherwise fall behind by its own lateness at every token, and a benchmark would count
    the mock's slowness as its client's."""
    chunk, deltas = "", 0
    start = trio.current_time()
    for frame in frames:
        if payloads.is_text_delta(frame):
            if deltas:
                yield chunk.encode()
                chunk = ""
                await trio.sleep_until(start + deltas * token_delay)
            deltas += 1
        chunk += frame
    yield chunk.encode()


class StreamDropped(Exception):
    """Raised inside a response body on purpose: the server aborts the connection mid-stream."""


def _dropping_response(app: QuartTrio, head: str) -> Any:
    async def body() -> Any:
        if head:
            yield head.encode()
            await trio.sleep(0.05)  # let the head reach the client before the connection breaks
        raise StreamDropped("mock LLM: dropping the stream as scripted (drop_after)")

    return app.response_class(body(), status=200, content_type="text/event-stream",
                              headers={"Cache-Control": "no-cache"})


def _bind(host: str, port: int) -> str:
    # Hypercorn wants IPv6 literals bracketed.
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


async def serve(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    delay: float = 0.0,
    token_delay: float = 0.0,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve a fresh mock app until cancelled.

    Reports the real bound base URL (e.g. "http://127.0.0.1:54321") through
    `task_status`, so `url = await nursery.start(serve)` works with port 0.
    """
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    config = Config()
    config.bind = [_bind(host, port)]
    # hypercorn's default accept queue is 100: a burst of connects beyond it (many runners, a load
    # test) waits out a 1 s SYN retransmit each, as omnigent's own server did (server/sockets.py)
    config.backlog = socket.SOMAXCONN
    config.accesslog = None
    # Errors still reach stderr; the "Running on" INFO line would only
    # duplicate the one line `main` prints on stdout.
    config.loglevel = "WARNING"
    app = create_app(delay, token_delay)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(hypercorn_serve, app, config))
        task_status.started(binds[0])


async def _serve_until_signal(host: str, port: int, delay: float = 0.0, token_delay: float = 0.0) -> None:
    # Exit cleanly (status 0) on SIGTERM/SIGINT: test fixtures terminate us.
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(partial(serve, host, port, delay=delay, token_delay=token_delay))
            print(f"mock-llm listening on {url}", flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


class ListenError(Exception):
    """The mock cannot listen where it was asked to: one line, `cannot listen on <host>:<port>: <cause>`."""


def main(host: str = "127.0.0.1", port: int = 0, delay: float = 0.0, token_delay: float = 0.0) -> None:
    """Run the mock server in the foreground; prints one 'listening' line to stdout.

    Raises ListenError when the address is taken or not ours."""
    try:
        trio.run(_serve_until_signal, host, port, delay, token_delay)
    except (OSError, BaseExceptionGroup) as exc:
        cause = _only_oserror(exc)
        if cause is None:
            raise
        raise ListenError(f"cannot listen on {host}:{port}: {cause.strerror or cause}") from None


def _only_oserror(exc: BaseException) -> OSError | None:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, OSError) else None


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m omnigent.testing.mock_llm",
        description="Scripted OpenAI-compatible mock LLM server.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=None, help="0 picks a free port (default)")
    # The original took the port positionally (`mock_llm_server.py <port>`).
    parser.add_argument("port_arg", nargs="?", type=int, metavar="PORT")
    parser.add_argument("--delay-ms", type=float, default=0.0,
                        help="every model call waits this long before answering (a model's own time)")
    parser.add_argument("--token-ms", type=float, default=0.0,
                        help="a streamed Responses answer sends each text delta this long after the one "
                             "before, as a model streams tokens (0: the whole answer at once)")
    args = parser.parse_args(argv)
    if args.port is not None and args.port_arg is not None and args.port != args.port_arg:
        parser.error("give the port once")
    args.port = args.port if args.port is not None else (args.port_arg or 0)
    return args


if __name__ == "__main__":
    _args = _parse_args(sys.argv[1:])
    try:
        main(_args.host, _args.port, _args.delay_ms / 1000, _args.token_ms / 1000)
    except ListenError as _exc:
        sys.exit(f"Error: {_exc}")
