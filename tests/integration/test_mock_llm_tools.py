"""The mock LLM scripts tool calls for both harnesses, and tells repeated requests apart by hash.

Why: the agent loop's tests (issue 9) script `tool_calls` entries and must
see them come back through the runner's harnesses as `function_call` items,
streamed or not; and "a repeated model call sends a byte-identical body"
is checked with the digests `GET /mock/requests?sha256=1` returns.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import httpx
import openai
import pytest
import trio
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from omnigent.runner import harness
from omnigent.testing.mock_llm import serve
from protocol import TurnCompleted, TurnStart

from .test_mock_llm import parse_sse

TIMEOUT = 10
CALLS = [{"name": "shell", "arguments": {"command": "ls -la"}, "call_id": "call_one"},
         {"name": "read_file", "arguments": '{"path": "notes.txt"}'}]


@pytest.fixture
async def url(nursery: trio.Nursery) -> str:
    return await nursery.start(serve)


@pytest.fixture
async def http(url: str):
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
        yield client


@pytest.fixture
async def llm(url: str):
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=TIMEOUT) as client:
        yield client


async def configure(http: httpx.AsyncClient, responses: list[Any]) -> None:
    (await http.post("/mock/configure", json={"responses": responses})).raise_for_status()


def turn(harness_name: str) -> TurnStart:
    agent = {"name": "a", "instructions": "x", "harness": harness_name, "model": "mock-model", "tools": []}
    return TurnStart(turn_id="turn_1", session_id="conv_1", attempt=1, agent=agent, model="mock-model",
                     input=[{"role": "user", "content": [{"type": "input_text", "text": "look"}]}])


async def nothing(frame: Any) -> None:
    pass


@pytest.mark.parametrize("harness_name", ["openai-agents", "openai-chat"])
async def test_scripted_tool_calls_reach_the_harness_as_function_call_items(http, llm, harness_name):
    await configure(http, [{"text": "Looking.", "tool_calls": CALLS}])
    result = await harness.HARNESSES[harness_name](llm, turn(harness_name), nothing)
    assert isinstance(result, TurnCompleted)
    message, first, second = result.output
    assert message["type"] == "message"
    assert (first["type"], first["call_id"], first["name"], json.loads(first["arguments"])) == (
        "function_call", "call_one", "shell", {"command": "ls -la"})
    assert (second["name"], second["arguments"], second["status"]) == ("read_file", '{"path": "notes.txt"}',
                                                                       "completed")
    assert second["call_id"]


async def test_chat_tool_calls_stream_in_pieces_and_validate(http):
    await configure(http, [{"tool_calls": CALLS}, {"tool_calls": CALLS}])
    body = {"model": "mock-model", "messages": [{"role": "user", "content": "x"}], "stream": True}
    frames = parse_sse((await http.post("/v1/chat/completions", json=body)).text)
    assert frames[-1] == (None, "[DONE]")
    chunks = [ChatCompletionChunk.model_validate(json.loads(data)) for _, data in frames[:-1]]
    pieces = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices[0].delta.tool_calls]
    assert [p.index for p in pieces] == [0, 0, 0, 1, 1, 1]
    assert pieces[0].id == "call_one" and pieces[0].function.name == "shell" and pieces[0].function.arguments == ""
    assert "".join(p.function.arguments or "" for p in pieces[:3]) == '{"command": "ls -la"}'
    assert pieces[1].id is None and chunks[-1].choices[0].finish_reason == "tool_calls"

    plain = ChatCompletion.model_validate((await http.post("/v1/chat/completions", json={**body, "stream": False})).json())
    message = plain.choices[0].message
    assert message.content is None and [c.function.name for c in message.tool_calls] == ["shell", "read_file"]
    assert plain.choices[0].finish_reason == "tool_calls"


async def test_requests_carry_the_sha256_of_their_exact_bytes(http):
    bodies = [b'{"model": "m", "input": "same"}', b'{"model": "m", "input": "same"}', b'{"model":"m","input":"same"}']
    for raw in bodies:
        (await http.post("/v1/responses", content=raw, headers={"content-type": "application/json"})).raise_for_status()
    found = (await http.get("/mock/requests", params={"sha256": "1"})).json()
    assert found["sha256"] == [hashlib.sha256(raw).hexdigest() for raw in bodies]
    assert found["sha256"][0] == found["sha256"][1] != found["sha256"][2]  # same JSON, other bytes: told apart
    assert "sha256" not in (await http.get("/mock/requests")).json()
    assert (await http.get("/mock/requests", params={"key": "other", "sha256": "1"})).json() == {
        "requests": [], "count": 0, "sha256": []}
