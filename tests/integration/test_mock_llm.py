"""Integration tests of the scripted mock LLM server (reference §6.2).

Why: every e2e test leans on this server, and the real `openai` SDK must
parse what it sends. So these run a real hypercorn server on a real socket
(port 0), script it with httpx like the e2e fixtures do, and talk to it with
the official `openai.AsyncOpenAI`. Frames are also validated strictly against
the SDK's pydantic models, because the SDK itself builds them without
validation and would silently accept a missing field.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx
import openai
import pydantic
import pytest
import trio
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent

from omnigent.testing.mock_llm import serve

# Generous bound for anything that waits on the server; a hang fails, not stalls.
TIMEOUT = 10

_STREAM_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)


@pytest.fixture
async def url(nursery: trio.Nursery) -> str:
    return await nursery.start(serve)


@pytest.fixture
async def http(url: str):
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
        yield client


@pytest.fixture
async def llm(url: str):
    # max_retries=0: the SDK would otherwise retry scripted 5xx errors and
    # consume the following entries. `async with` closes the socket (G6).
    async with openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=TIMEOUT
    ) as client:
        yield client


async def configure(http: httpx.AsyncClient, responses: list[Any], **extra: Any) -> dict[str, Any]:
    resp = await http.post("/mock/configure", json={"responses": responses, **extra})
    resp.raise_for_status()
    return resp.json()


async def ask(llm: openai.AsyncOpenAI, model: str = "mock-model", text: str = "hi") -> str:
    response = await llm.responses.create(model=model, input=text)
    return response.output_text


async def stream_events(llm: openai.AsyncOpenAI, **kwargs: Any) -> list[Any]:
    stream = await llm.responses.create(stream=True, **kwargs)
    return [event async for event in stream]


def parse_sse(body: str) -> list[tuple[str | None, str]]:
    """(event name, data) per frame of an SSE body."""
    frames = []
    for block in body.split("\n\n"):
        if not block.strip():
            continue
        event = None
        data = []
        for line in block.split("\n"):
            if line.startswith("event: "):
                event = line[len("event: "):]
            elif line.startswith("data: "):
                data.append(line[len("data: "):])
        frames.append((event, "\n".join(data)))
    return frames


# -- Responses API ---------------------------------------------------------


async def test_responses_non_stream_text(http, llm):
    assert await configure(http, [{"text": "hello there"}]) == {
        "configured": True, "key": "default", "count": 1,
    }
    response = await llm.responses.create(model="mock-model", input="hi")
    assert isinstance(response, Response)
    assert response.output_text == "hello there"
    assert response.id.startswith("resp_")
    assert response.object == "response"
    assert response.status == "completed"
    assert response.model == "mock-model"
    assert response.usage.input_tokens == 10
    assert response.usage.output_tokens == 5  # max(5, 2 words)


async def test_responses_non_stream_validates_strictly(http):
    await configure(http, [{"text": "strict"}])
    resp = await http.post("/v1/responses", json={"model": "mock-model", "input": "hi"})
    assert resp.status_code == 200
    response = Response.model_validate(resp.json())
    assert response.output_text == "strict"


async def test_responses_stream_events(http, llm):
    await configure(http, [{"text": "alpha beta"}])
    events = await stream_events(llm, model="mock-model", input="hi")
    assert [e.type for e in events] == [
        "response.created",
        "response.output_item.added",
        "response.output_text.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress"
    assert events[0].response.output == []
    assert events[2].text == "alpha beta"
    item = events[3].item
    assert item.type == "message"
    assert item.content[0].text == "alpha beta"
    completed = events[-1].response
    assert completed.output_text == "alpha beta"
    assert completed.model == "mock-model"
    assert (completed.usage.input_tokens, completed.usage.output_tokens) == (10, 5)


async def test_responses_stream_word_deltas(http, llm):
    text = "one two three four five six seven"
    await configure(http, [{"text": text, "stream": True}])
    events = await stream_events(llm, model="mock-model", input="hi")
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) == 7
    assert "".join(deltas) == text
    done_index = [e.type for e in events].index("response.output_text.done")
    assert all(e.type != "response.output_text.delta" for e in events[done_index:])
    assert events[-1].response.usage.output_tokens == 7


async def test_stream_frames_validate_against_sdk_models(http):
    await configure(http, [
        {"text": "a b c", "stream": True},
        {"text": "calling", "tool_calls": [{"name": "lookup", "arguments": {"q": 1}}]},
    ])
    for _ in range(2):
        resp = await http.post(
            "/v1/responses", json={"model": "mock-model", "input": "hi", "stream": True}
        )
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        frames = parse_sse(resp.text)
        for seq, (event_name, data) in enumerate(frames):
            payload = json.loads(data)
            assert event_name == payload["type"]
            assert payload["sequence_number"] == seq
            _STREAM_EVENT.validate_python(payload)  # strict: raises on a missing field
    # The second body carried a function_call item with JSON-string arguments.
    completed = json.loads(frames[-1][1])["response"]
    call = completed["output"][1]
    assert (call["type"], call["name"], json.loads(call["arguments"])) == (
        "function_call", "lookup", {"q": 1},
    )


async def test_tool_call_entry_with_sdk(http, llm):
    await configure(http, [{"tool_calls": [{"name": "get_time", "arguments": "{}"}]}] * 2)
    response = await llm.responses.create(model="mock-model", input="time?")
    [call] = response.output
    assert (call.type, call.name, call.arguments) == ("function_call", "get_time", "{}")
    assert call.call_id
    events = await stream_events(llm, model="mock-model", input="time?")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [d.arguments for d in done] == ["{}"]


# -- Chat Completions ------------------------------------------------------


async def test_chat_completions_non_stream(http, llm):
    await configure(http, ["chat answer"])  # bare strings are shorthand for {"text"}
    completion = await llm.chat.completions.create(
        model="mock-model", messages=[{"role": "user", "content": "hi"}]
    )
    assert completion.choices[0].message.content == "chat answer"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.model == "mock-model"
    resp = await http.post(
        "/v1/chat/completions",
        json={"model": "mock-model", "messages": [{"role": "user", "content": "x"}]},
    )
    ChatCompletion.model_validate(resp.json())


async def test_chat_completions_stream(http, llm):
    await configure(http, [{"text": "streamed chat"}, {"text": "raw"}])
    stream = await llm.chat.completions.create(
        model="mock-model", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert len(chunks) == 2
    assert chunks[0].choices[0].delta.content == "streamed chat"
    assert chunks[1].choices[0].finish_reason == "stop"
    resp = await http.post(
        "/v1/chat/completions",
        json={"model": "mock-model", "messages": [{"role": "user", "content": "x"}], "stream": True},
    )
    frames = parse_sse(resp.text)
    assert frames[-1] == (None, "[DONE]")
    for _, data in frames[:-1]:
        ChatCompletionChunk.model_validate(json.loads(data))


# -- Routing ---------------------------------------------------------------


async def test_routing_by_model_key_exactly(http, llm):
    await configure(http, ["for model a"], key="model-a")
    await configure(http, ["default 1", "default 2"])
    assert await ask(llm, model="model-b") == "default 1"
    assert await ask(llm, model="model-a") == "for model a"
    # Exact match only: a prefixed/longer model name is not routed to model-a.
    assert await ask(llm, model="openai/model-a") == "default 2"
    # model-a is exhausted and has no fallback: the default text, not an error.
    assert await ask(llm, model="model-a") == "Mock LLM response"


async def test_match_routing_longest_token_wins(http, llm):
    await configure(http, ["plant generic"], key="k-short", match="plant")
    await configure(http, ["plant B answer"], key="k-long", match="plant B")
    await configure(http, ["by model"], key="mock-model")
    # Match beats the model key, and the longer token wins over "plant".
    assert await ask(llm, text="please water plant B now") == "plant B answer"
    assert await ask(llm, text="plant A") == "plant generic"
    # Without a token in the user text, routing falls back to the model key.
    assert await ask(llm, text="nothing here") == "by model"


async def test_match_only_looks_at_user_text(http, llm):
    await configure(http, ["matched"], key="k", match="SECRET")
    await configure(http, ["not matched"])
    response = await llm.responses.create(
        model="other",
        input=[
            {"role": "system", "content": "SECRET in system prompt"},
            {"role": "assistant", "content": "SECRET in history"},
            {"role": "user", "content": [{"type": "input_text", "text": "plain question"}]},
        ],
    )
    assert response.output_text == "not matched"
    completion = await llm.chat.completions.create(
        model="other", messages=[{"role": "user", "content": "the SECRET word"}]
    )
    assert completion.choices[0].message.content == "matched"


async def test_default_text_when_unconfigured(llm):
    assert await ask(llm) == "Mock LLM response"
    assert await ask(llm, model="anything") == "Mock LLM response"


async def test_configure_resets_only_that_key(http, llm):
    await configure(http, ["a1", "a2"], key="model-a")
    await configure(http, ["b1"], key="model-b")
    assert await ask(llm, model="model-a") == "a1"
    await configure(http, ["a-new"], key="model-a")  # drops "a2" and restarts the index
    assert await ask(llm, model="model-a") == "a-new"
    assert await ask(llm, model="model-b") == "b1"


async def test_set_fallback_survives_reset(http, llm):
    resp = await http.post("/mock/set_fallback", json={"key": "fb-model", "text": "fallback!"})
    assert resp.status_code == 200
    await configure(http, ["scripted"], key="fb-model")
    await configure(http, ["default scripted"])
    assert await ask(llm, model="fb-model") == "scripted"
    assert await ask(llm, model="fb-model") == "fallback!"
    assert (await http.post("/mock/reset")).status_code == 200
    # The fallback queue is kept, the plain default script is gone.
    assert await ask(llm, model="fb-model") == "fallback!"
    assert await ask(llm, model="mock-model") == "Mock LLM response"


# -- Errors and gates ------------------------------------------------------


async def test_error_entry_raises_api_status_error(http, llm):
    await configure(http, [
        {"error": "rate limited", "status_code": 429},
        {"error": True},
        "after errors",
    ])
    with pytest.raises(openai.APIStatusError) as first:
        await ask(llm)
    assert first.value.status_code == 429
    assert first.value.body == {"message": "rate limited", "type": "mock_error"}
    with pytest.raises(openai.APIStatusError) as second:
        await ask(llm)
    assert second.value.status_code == 500
    assert await ask(llm) == "after errors"


async def test_error_entry_sends_retry_after(http, llm):
    await configure(http, [{"error": "slow down", "status_code": 429, "retry_after": 1.5}])
    with pytest.raises(openai.RateLimitError) as caught:
        await llm.responses.create(model="m", input="hi")
    assert caught.value.response.headers["retry-after"] == "1.5"


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_drop_after_sends_that_much_text_then_breaks_the_connection(http, llm, api):
    await configure(http, [{"text": "one two three", "stream": True, "drop_after": 8}])
    received = []
    with pytest.raises(openai.APIConnectionError):
        if api == "responses":
            stream = await llm.responses.create(model="m", input="hi", stream=True)
            async for event in stream:
                assert event.type not in ("response.completed", "response.output_item.done")
                if event.type == "response.output_text.delta":
                    received.append(event.delta)
        else:
            stream = await llm.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                       stream=True)
            async for chunk in stream:
                assert chunk.choices[0].finish_reason is None
                received.append(chunk.choices[0].delta.content)
    assert "".join(received) == "one two "


async def test_should_retry_false_stops_sdk_retries(url, http):
    await configure(http, [{"error": "boom", "status_code": 503, "should_retry": False}, "next"])
    # Default retries (2): without the header the SDK would retry and get "next".
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", timeout=TIMEOUT) as llm:
        with pytest.raises(openai.APIStatusError) as err:
            await ask(llm)
    assert err.value.status_code == 503
    assert (await http.get("/stats")).json() == {"request_count": 1}


async def wait_for_pending(http: httpx.AsyncClient, count: int) -> list[dict[str, Any]]:
    # Polling is fine here: parked requests are state of another task on the
    # far side of a socket; the loop is bounded by fail_after.
    with trio.fail_after(TIMEOUT):
        while True:
            pending = (await http.get("/gate/pending")).json()
            if pending["count"] == count:
                return pending["pending"]
            await trio.sleep(0.01)


async def test_block_parks_until_gate_release(http, llm, nursery):
    await configure(http, [{"text": "released text", "block": True}, "not blocked"])
    results: dict[str, str] = {}
    finished = trio.Event()

    async def blocked_call() -> None:
        results["blocked"] = await ask(llm, model="mock-model")
        finished.set()

    nursery.start_soon(blocked_call)
    [gate] = await wait_for_pending(http, 1)
    assert gate["key"] == "default"
    assert gate["model"] == "mock-model"
    # The server keeps serving while one request is parked.
    assert await ask(llm) == "not blocked"
    assert not finished.is_set()

    resp = await http.post("/gate/release", json={"gate_id": "gate-does-not-exist"})
    assert resp.status_code == 404
    assert not finished.is_set()

    resp = await http.post("/gate/release", json={"gate_id": gate["gate_id"]})
    assert resp.json() == {"released": [gate["gate_id"]], "count": 1}
    with trio.fail_after(TIMEOUT):
        await finished.wait()
    assert results["blocked"] == "released text"
    assert (await http.get("/gate/pending")).json() == {"pending": [], "count": 0}


async def test_release_all_and_reset_release_gates(http, llm, nursery):
    await configure(http, [{"text": f"gated {i}", "block": True} for i in range(3)])
    send, receive = trio.open_memory_channel[str](10)

    async def call() -> None:
        await send.send(await ask(llm))

    for _ in range(3):
        nursery.start_soon(call)
    await wait_for_pending(http, 3)
    resp = await http.post("/gate/release")  # no body: release every gate
    assert resp.json()["count"] == 3
    with trio.fail_after(TIMEOUT):
        assert sorted([await receive.receive() for _ in range(3)]) == [
            "gated 0", "gated 1", "gated 2",
        ]

    await configure(http, [{"text": "gated by reset", "block": True}])
    nursery.start_soon(call)
    await wait_for_pending(http, 1)
    assert (await http.post("/mock/reset")).json()["released"] == ["gate-4"]
    with trio.fail_after(TIMEOUT):
        assert await receive.receive() == "gated by reset"


# -- Captures, stats, control-plane errors ---------------------------------


async def test_requests_are_captured(http, llm):
    await llm.responses.create(model="model-a", input="first question")
    await llm.responses.create(
        model="model-b", input=[{"role": "user", "content": "second question"}]
    )
    await llm.chat.completions.create(
        model="model-a", messages=[{"role": "user", "content": "third"}]
    )
    everything = (await http.get("/mock/requests")).json()
    assert everything["count"] == 3
    first, second, third = everything["requests"]
    assert (first["model"], first["input"]) == ("model-a", "first question")
    assert second["input"] == [{"role": "user", "content": "second question"}]
    assert third["messages"] == [{"role": "user", "content": "third"}]
    only_a = (await http.get("/mock/requests", params={"key": "model-a"})).json()
    assert [body["model"] for body in only_a["requests"]] == ["model-a", "model-a"]
    await http.post("/mock/reset")
    assert (await http.get("/mock/requests")).json() == {"requests": [], "count": 0}


async def test_stats_count_llm_requests(http, llm):
    assert (await http.get("/stats")).json() == {"request_count": 0}
    await ask(llm)
    await llm.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    await http.get("/v1/models")  # not an LLM call
    assert (await http.get("/stats")).json() == {"request_count": 2}
    await http.post("/mock/reset")
    assert (await http.get("/stats")).json() == {"request_count": 0}


async def test_models_endpoint(http):
    assert (await http.get("/v1/models")).json() == {"object": "list", "data": []}


@pytest.mark.parametrize("path", [
    "/mock/configure", "/mock/set_fallback", "/mock/reset", "/gate/release",
    "/v1/responses", "/v1/chat/completions",
])
async def test_bad_json_is_a_400_json_error(http, path):
    resp = await http.post(path, content=b"{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 400
    assert resp.json()["error"]["message"]


@pytest.mark.parametrize("body", [
    [1, 2],
    {"responses": "nope"},
    {"responses": [42]},
    {"responses": [{"text": 5}]},
    {"responses": [{"tool_calls": [{"arguments": "{}"}]}]},
    {"responses": [{"error": True, "status_code": "500"}]},
    {"responses": [{"error": True, "retry_after": [1]}]},
    {"responses": [{"text": "x", "drop_after": -1}]},
    {"key": 3, "responses": []},
])
async def test_bad_configure_bodies_are_400(http, body):
    resp = await http.post("/mock/configure", json=body)
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == "invalid_request_error"


async def test_set_fallback_requires_text(http):
    resp = await http.post("/mock/set_fallback", json={"key": "k"})
    assert resp.status_code == 400


# -- Process entry point ---------------------------------------------------


async def test_module_entry_point_serves():
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "omnigent.testing.mock_llm", "--port", "0"],
        stdout=subprocess.PIPE,
    )
    try:
        buffer = b""
        with trio.fail_after(TIMEOUT):
            while b"\n" not in buffer:
                chunk = await proc.stdout.receive_some()
                assert chunk, f"mock-llm exited early: {buffer!r}"
                buffer += chunk
        line = buffer.split(b"\n", 1)[0].decode()
        prefix = "mock-llm listening on "
        assert line.startswith(prefix + "http://127.0.0.1:")
        base = line[len(prefix):]
        assert int(base.rsplit(":", 1)[1]) > 0
        async with httpx.AsyncClient(base_url=base, timeout=TIMEOUT) as client:
            assert (await client.get("/stats")).json() == {"request_count": 0}
        proc.terminate()
        with trio.fail_after(TIMEOUT):
            assert await proc.wait() == 0  # SIGTERM is a clean shutdown
    finally:
        if proc.returncode is None:
            proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
        await proc.stdout.aclose()
