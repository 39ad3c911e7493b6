"""Unit tests of the runner's model calls (omnigent/runner/harness.py).

Why: the request a model receives (exact model name, full history, the
instructions) and the frames a turn produces are the runner's contract with
both the provider and the server. The real `openai.AsyncOpenAI` runs over
`httpx2.MockTransport` (stack-notes §4), so no sockets and no clock.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import httpx2
import openai
import trio
import pytest

from omnigent.runner import credentials, harness, main
from omnigent.runner.streams import EmptyStream
from protocol import TurnCompleted, TurnEvent, TurnFailed, TurnStart, decode, encode
from protocol.events import decode_event

USER = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
ASSISTANT = {
    "type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
    "created_at": 123, "content": [{"type": "output_text", "text": "hello", "annotations": []}],
}
USER2 = {"type": "message", "id": "item_9", "role": "user", "content": [{"type": "input_text", "text": "again"}]}


def make_turn(harness_name: str = "openai-agents", **agent: Any) -> TurnStart:
    spec = {"name": "a", "instructions": "Be brief.", "harness": harness_name, "model": "spec-model",
            "auth": None, "reasoning_effort": None}
    spec.update(agent)
    return TurnStart(turn_id="turn_1", session_id="conv_1", attempt=1, agent=spec,
                     input=[USER, ASSISTANT, USER2], model="mock-model")


def sse(events: list[dict[str, Any]], done: bool = False) -> bytes:
    body = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" if "type" in e else f"data: {json.dumps(e)}\n\n"
                   for e in events)
    if done:
        body += "data: [DONE]\n\n"
    return body.encode()


def message_item(text: str) -> dict[str, Any]:
    return {"type": "message", "id": "msg_x", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def responses_stream(text: str, deltas: list[str] = ()) -> bytes:
    item = message_item(text)
    response = {"id": "resp_abc", "object": "response", "created_at": 1, "model": "mock-model",
                "status": "completed", "output": [item], "parallel_tool_calls": True, "tool_choice": "auto",
                "tools": [], "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15,
                                       "input_tokens_details": {"cached_tokens": 0},
                                       "output_tokens_details": {"reasoning_tokens": 0}}}
    events = [{"type": "response.created", "sequence_number": 0,
               "response": {**response, "status": "in_progress", "output": [], "usage": None}}]
    events += [{"type": "response.output_text.delta", "sequence_number": 1, "item_id": "msg_x",
                "output_index": 0, "content_index": 0, "delta": d, "logprobs": []} for d in deltas]
    events += [
        {"type": "response.output_text.done", "sequence_number": 2, "item_id": "msg_x", "output_index": 0,
         "content_index": 0, "text": text, "logprobs": []},
        {"type": "response.output_item.done", "sequence_number": 3, "output_index": 0, "item": item},
        {"type": "response.completed", "sequence_number": 4, "response": response},
    ]
    return sse(events)


class FakeLLM:
    """Records every request body and answers with a scripted response."""

    def __init__(self, *answers: httpx2.Response) -> None:
        self.answers = list(answers)
        self.requests: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append((request.url.path, json.loads(request.content)))
        return self.answers.pop(0)

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(api_key="x", base_url="http://mock/v1", max_retries=0,
                                  http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(self)))


def sse_response(body: bytes) -> httpx2.Response:
    return httpx2.Response(200, content=body, headers={"content-type": "text/event-stream"})


class Recorder:
    def __init__(self) -> None:
        self.frames: list[TurnEvent] = []
        self.ended: TurnCompleted | TurnFailed | None = None  # a step's end, emitted once and last

    async def __call__(self, frame: TurnEvent | TurnCompleted | TurnFailed) -> None:
        # Everything emitted must survive the wire and the server's event check.
        assert decode(encode(frame)) == frame
        assert self.ended is None, f"{frame!r} emitted after the step's end"
        if isinstance(frame, TurnEvent):
            decode_event(frame.event)
            self.frames.append(frame)
        else:
            self.ended = frame

    @property
    def types(self) -> list[str]:
        return [f.event["type"] for f in self.frames]


@pytest.fixture
async def llm_factory():
    clients: list[openai.AsyncOpenAI] = []

    def make(*answers: httpx2.Response) -> tuple[FakeLLM, openai.AsyncOpenAI]:
        fake = FakeLLM(*answers)
        clients.append(fake.client())
        return fake, clients[-1]

    yield make
    for c in clients:
        await c.close()


# --- input normalization ------------------------------------------------------


def test_normalize_input_sends_items_as_received_without_omnigent_fields():
    stored = {**ASSISTANT, "response_id": "resp_1", "turn_id": "turn_0"}
    out = harness.normalize_input([{"role": "user", "content": USER["content"]}, stored])
    assert out == [
        {"role": "user", "content": USER["content"]},
        {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "hello", "annotations": []}]},
    ]


def test_chat_messages_alternate_after_items_without_chat_form():
    items = [USER, {"type": "function_call", "id": "fc_1", "call_id": "c", "name": "f", "arguments": "{}"},
             {**ASSISTANT, "content": [{"type": "output_text", "text": ""}]}, USER2]
    assert harness.chat_messages(None, items) == [{"role": "user", "content": "hi\n\nagain"}]


def test_chat_messages_flatten_history():
    assert harness.chat_messages("Be brief.", [USER, ASSISTANT, USER2, {"type": "function_call"}]) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again"},
    ]
    assert harness.chat_messages("", [{"role": "developer", "content": "d"}]) == [
        {"role": "system", "content": "d"}]


def test_runner_advertises_exactly_the_harnesses_it_implements():
    assert main.HARNESSES == list(harness.HARNESSES)


# --- openai-agents (Responses API) --------------------------------------------


async def test_responses_request_events_and_completion(llm_factory):
    fake, client = llm_factory(sse_response(responses_stream("HELLO world", deltas=["HELLO ", "world"])))
    emit = Recorder()
    result = await harness.respond(client, make_turn(), emit)

    [(path, body)] = fake.requests
    assert path == "/v1/responses"
    assert body == {
        "model": "mock-model",
        "instructions": "Be brief.",
        "input": harness.normalize_input([USER, ASSISTANT, USER2]),
        "stream": True,
    }
    assert emit.types == ["response.output_text.delta", "response.output_text.delta", "response.output_item.done"]
    assert [f.event.get("delta") for f in emit.frames[:2]] == ["HELLO ", "world"]
    assert all(f.turn_id == "turn_1" and f.event["turn_id"] == "turn_1" for f in emit.frames)
    item = emit.frames[2].event["item"]
    assert item["content"][0]["text"] == "HELLO world" and item["role"] == "assistant"

    assert isinstance(result, TurnCompleted)
    assert result.turn_id == "turn_1" and result.response_id == "resp_abc"
    assert result.output == [item]
    assert result.usage["input_tokens"] == 10 and result.usage["output_tokens"] == 5
    assert decode(encode(result)) == result


class _HeldOpen(httpx2.AsyncByteStream):
    """A response body whose end comes only once `release` is set (as a real one ends in a later read)."""

    def __init__(self, body: bytes, release: trio.Event) -> None:
        self.body, self.release = body, release

    async def __aiter__(self):
        yield self.body
        await self.release.wait()
        yield b": the end of the body\n\n"


async def test_responses_end_goes_out_before_the_stream_is_read_to_its_end(llm_factory):
    """The terminal frame is emitted as `response.completed` is read: the answer does not wait for
    the HTTP body's end. The stream is still read to its end (its connection is reused), and
    `respond` returns the same frame, with nothing emitted after it."""
    release = trio.Event()
    body = _HeldOpen(responses_stream("hi", deltas=["hi"]), release)
    _, client = llm_factory(httpx2.Response(200, stream=body, headers={"content-type": "text/event-stream"}))

    class Releasing(Recorder):
        async def __call__(self, frame: Any) -> None:
            await super().__call__(frame)
            if self.ended is not None:
                release.set()  # the body ends only once the end has gone out

    emit = Releasing()
    with trio.fail_after(10):
        result = await harness.respond(client, make_turn(), emit)
    assert isinstance(result, TurnCompleted) and emit.ended == result
    assert emit.types == ["response.output_text.delta", "response.output_item.done"]


async def test_responses_reasoning_effort_only_when_set(llm_factory):
    fake, client = llm_factory(sse_response(responses_stream("a")), sse_response(responses_stream("b")))
    await harness.respond(client, make_turn(reasoning_effort="high"), Recorder())
    turn = make_turn()
    turn = TurnStart(**{**turn.__dict__, "reasoning_effort": "low"})
    await harness.respond(client, turn, Recorder())
    assert fake.requests[0][1]["reasoning"] == {"effort": "high"}
    assert fake.requests[1][1]["reasoning"] == {"effort": "low"}


async def test_responses_failed_event_is_a_turn_failure(llm_factory):
    failed = {"type": "response.failed", "sequence_number": 1, "response": {
        "id": "resp_f", "object": "response", "created_at": 1, "model": "m", "status": "failed", "output": [],
        "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        "error": {"code": "server_error", "message": "the model\nfell over"}}}
    _, client = llm_factory(sse_response(sse([failed])))
    result = await harness.respond(client, make_turn(), Recorder())
    assert result == TurnFailed("turn_1", "model_error", "server_error: the model fell over")


async def test_responses_stream_without_output_or_completion_is_retryable(llm_factory):
    _, client = llm_factory(sse_response(sse([])))
    with pytest.raises(EmptyStream):
        await harness.respond(client, make_turn(), Recorder())


# --- openai-chat (Chat Completions) -------------------------------------------


def chat_chunk(content: str | None, usage: dict | None = None) -> dict[str, Any]:
    choices = [] if content is None else [{"index": 0, "delta": {"role": "assistant", "content": content},
                                           "finish_reason": None}]
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "mock-model",
             "choices": choices}
    if usage:
        chunk["usage"] = usage
    return chunk


def chat_finish() -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "mock-model",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}


async def test_chat_request_events_and_completion(llm_factory):
    body = sse([chat_chunk("HEL"), chat_chunk("LO"), chat_finish(),
                chat_chunk(None, {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9})], done=True)
    fake, client = llm_factory(sse_response(body))
    emit = Recorder()
    result = await harness.chat(client, make_turn("openai-chat", reasoning_effort="low"), emit)

    [(path, sent)] = fake.requests
    assert path == "/v1/chat/completions"
    assert sent == {
        "model": "mock-model",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                     {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "reasoning_effort": "low",
    }
    item = emit.frames[-1].event["item"]
    assert item == {"id": item["id"], "type": "message", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "HELLO", "annotations": []}]}
    assert emit.types == ["response.output_text.delta", "response.output_text.delta", "response.output_item.done"]
    assert isinstance(result, TurnCompleted)
    assert result.response_id.startswith("resp_") and len(result.response_id) == 5 + 32
    assert result.output == [item]
    assert result.usage == {"input_tokens": 7, "output_tokens": 2, "total_tokens": 9}


# --- execute: harness choice, credentials, error mapping -----------------------


class StubPool:
    def __init__(self, client: openai.AsyncOpenAI) -> None:
        self.client = client
        self.keys: list[tuple[str, str | None]] = []

    def get(self, api_key: str, base_url: str | None) -> openai.AsyncOpenAI:
        self.keys.append((api_key, base_url))
        return self.client


ENV = {"OPENAI_API_KEY": "env-key", "OPENAI_BASE_URL": "http://env/v1"}
ONE_ATTEMPT = {**ENV, "OMNIGENT_MODEL_ATTEMPTS": "1"}  # error mapping without the retry policy


async def test_execute_maps_http_error_to_one_line_model_error(llm_factory):
    error = httpx2.Response(500, json={"error": {"message": "mock failure", "type": "mock_error"}})
    fake, client = llm_factory(error)
    result = await harness.execute(StubPool(client), make_turn(), Recorder(), ONE_ATTEMPT)
    assert result == TurnFailed("turn_1", "model_error", "Error code: 500 - mock failure")
    assert len(fake.requests) == 1  # max_retries=0: exactly one model call


async def test_execute_maps_connection_error(llm_factory):
    def refuse(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("All connection attempts failed", request=request)

    client = openai.AsyncOpenAI(api_key="x", base_url="http://mock/v1", max_retries=0,
                                http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(refuse)))
    try:
        result = await harness.execute(StubPool(client), make_turn(), Recorder(), ONE_ATTEMPT)
    finally:
        await client.close()
    assert isinstance(result, TurnFailed) and result.code == "model_error"
    assert result.message.startswith("Connection error: could not reach http://mock/v1/responses")
    assert "\n" not in result.message


async def test_execute_auth_missing_tells_how_to_fix():
    result = await harness.execute(StubPool(None), make_turn(), Recorder(), {})
    assert result.code == "auth_missing"
    assert "OPENAI_API_KEY" in result.message and "OPENAI_BASE_URL" in result.message


async def test_execute_unknown_harness():
    result = await harness.execute(StubPool(None), make_turn("claude-sdk"), Recorder(), ENV)
    assert result.code == "unsupported_harness"


async def test_execute_uses_env_credentials_and_dispatches_chat(llm_factory):
    fake, client = llm_factory(sse_response(sse([chat_chunk("ok"), chat_finish()], done=True)))
    pool = StubPool(client)
    result = await harness.execute(pool, make_turn("openai-chat"), Recorder(), ENV)
    assert isinstance(result, TurnCompleted)
    assert pool.keys == [("env-key", "http://env/v1")]
    assert fake.requests[0][0] == "/v1/chat/completions"


async def test_client_pool_reuses_and_closes():
    made = []

    class FakeClient:
        closed = False

        async def close(self):
            self.closed = True

    def factory(key, url):
        made.append(FakeClient())
        return made[-1]

    pool = harness.ClientPool(factory)
    a = pool.get("k", None)
    assert pool.get("k", None) is a
    b = pool.get("k", "http://other/v1")
    assert b is not a and len(made) == 2
    await pool.aclose()
    assert a.closed and b.closed


async def test_real_client_settings():
    client = harness._new_client("k", "http://127.0.0.1:9/v1")
    try:
        assert client.max_retries == 0
        assert client.timeout.connect == 10.0 and client.timeout.read == 600.0
        assert str(client.base_url) == "http://127.0.0.1:9/v1/"
    finally:
        await client.close()


# --- credentials ----------------------------------------------------------------


def test_credentials_expand_vars_and_fall_back():
    agent = {"auth": {"api_key": "${MY_KEY}", "base_url": "http://${HOST}/v1"}}
    assert credentials.resolve(agent, {"MY_KEY": "k", "HOST": "h:1"}) == ("k", "http://h:1/v1")
    assert credentials.resolve({"auth": None}, ENV) == ("env-key", "http://env/v1")
    assert credentials.resolve({"auth": {"api_key": "literal"}}, {}) == ("literal", None)


def test_credentials_unset_var_is_named():
    with pytest.raises(credentials.MissingCredentials, match=r"\$\{MY_KEY\}"):
        credentials.resolve({"auth": {"api_key": "${MY_KEY}"}}, ENV)


async def test_responses_error_event_is_a_turn_failure(llm_factory):
    error = {"type": "error", "sequence_number": 1, "code": "rate_limit_exceeded", "message": "slow down",
             "param": None}
    _, client = llm_factory(sse_response(sse([error])))
    result = await harness.respond(client, make_turn(), Recorder())
    assert result == TurnFailed("turn_1", "model_error", "rate_limit_exceeded: slow down")


async def test_execute_maps_timeout(llm_factory):
    def hang(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ReadTimeout("timed out", request=request)

    client = openai.AsyncOpenAI(api_key="x", base_url="http://mock/v1", max_retries=0,
                                http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(hang)))
    try:
        result = await harness.execute(StubPool(client), make_turn(), Recorder(), ONE_ATTEMPT)
    finally:
        await client.close()
    assert result == TurnFailed("turn_1", "model_error",
                                "Request timed out: no answer from http://mock/v1/responses")


async def test_prewarm_builds_the_environment_client_only_with_credentials():
    made = []

    class FakeClient:
        responses = None
        chat = SimpleNamespace(completions=None)

    pool = harness.ClientPool(lambda key, url: made.append((key, url)) or FakeClient())
    harness.prewarm(pool, {})
    assert made == []
    harness.prewarm(pool, ENV)
    assert made == [("env-key", "http://env/v1")]


async def test_both_requests_are_the_bytes_and_headers_the_sdk_sends():
    """wire.create_response / create_chat post through the client themselves (to get the
    events as dicts): the endpoint must see exactly what `responses.create` /
    `chat.completions.create` would have sent it: the same JSON (the SDK's own key order
    is not kept for these; the byte-exact Responses body of a turn is test_history_cache's)
    and the same headers."""
    from omnigent.runner.wire import create_chat, create_response

    seen: list[tuple[str, bytes, dict]] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        headers = {k: v for k, v in request.headers.items() if k != "x-stainless-retry-count"}
        seen.append((str(request.url), json.loads(request.content), headers))
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=b"data: [DONE]\n\n")

    client = openai.AsyncOpenAI(api_key="x", base_url="http://mock/v1", max_retries=0,
                                http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)))
    tool = {"type": "function", "function": {"name": "shell", "description": "d",
                                             "parameters": {"type": "object", "properties": {}}}}
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": {"include_usage": True}, "reasoning_effort": "low", "tools": [tool]}
    responses = {"model": "m", "input": [USER], "stream": True, "instructions": "x", "temperature": 0.5}
    for ours, sdks in ((create_chat(client, chat), client.chat.completions.create(**chat)),
                       (create_response(client, responses), client.responses.create(**responses))):
        for call in (ours, sdks):
            async for _ in await call:
                pass
    await client.close()
    assert seen[0] == seen[1] and seen[2] == seen[3]
    assert seen[0][0].endswith("/chat/completions") and seen[2][0].endswith("/responses")
