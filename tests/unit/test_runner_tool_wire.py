"""Tool calls on the model wire, both harnesses (omnigent/runner/{streams,wire}.py).

Why: what a provider accepts is shape-exact (a chat `tool` message needs
the assistant `tool_calls` it answers; the Responses API wants its own
`function_call` items back), the store holds one shape whichever harness
made the call, and a model step sent again after a crash must send the same
bytes (issue 9, "Killed during a model call"). Over `httpx2.MockTransport`,
as the harness tests do.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import httpx2
import openai
import pytest

from omnigent.runner import harness, streams
from omnigent.runner.wire import NO_WORKSPACE, chat_messages, chat_tools, responses_tools
from protocol import TurnCompleted, TurnStart

from .test_runner_harness import USER, Recorder, chat_finish, sse, sse_response

DEFINITIONS = [
    {"name": "shell", "description": "Run a command.",
     "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
    {"name": "read_file", "description": "Read a file.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
]
CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "shell",
        "arguments": '{"command": "ls"}', "status": "completed"}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "a.txt\nexit code: 0"}


@pytest.fixture(autouse=True)
def fake_definitions(monkeypatch):
    """The tools package is helper T's; the wire only needs its neutral definitions."""
    asked: list[list[str]] = []

    def definitions(names: list[str]) -> list[dict[str, Any]]:
        asked.append(list(names))
        return [d for d in DEFINITIONS if d["name"] in names]

    monkeypatch.setattr(streams, "_definitions", definitions)
    return asked


def turn(harness_name: str = "openai-agents", *, tools=("shell", "read_file"), workspace: str | None = "/w",
         items: list[dict] | None = None, step: int = 0) -> TurnStart:
    agent = {"name": "a", "instructions": "Be brief.", "harness": harness_name, "model": "m",
             "auth": None, "reasoning_effort": None, "tools": list(tools)}
    return TurnStart(turn_id="turn_1", session_id="conv_1", attempt=1, agent=agent,
                     input=items if items is not None else [USER], model="m", step=step, workspace=workspace)


class RawLLM:
    """Records every request's exact bytes and answers with scripted bodies."""

    def __init__(self, *answers: bytes) -> None:
        self.answers = list(answers)
        self.bodies: list[bytes] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.bodies.append(request.content)
        return sse_response(self.answers.pop(0))

    def json(self, n: int = -1) -> dict[str, Any]:
        return json.loads(self.bodies[n])


@pytest.fixture
async def raw_llm():
    clients: list[openai.AsyncOpenAI] = []

    def make(*answers: bytes) -> tuple[RawLLM, openai.AsyncOpenAI]:
        fake = RawLLM(*answers)
        clients.append(openai.AsyncOpenAI(api_key="x", base_url="http://mock/v1", max_retries=0,
                                          http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(fake))))
        return fake, clients[-1]

    yield make
    for c in clients:
        await c.close()


def responses_calls_stream(*calls: dict[str, Any], text: str | None = None) -> bytes:
    output = []
    if text is not None:
        output.append({"type": "message", "id": "msg_t", "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": text, "annotations": []}]})
    output += list(calls)
    response = {"id": "resp_c", "object": "response", "created_at": 1, "model": "m", "status": "completed",
                "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
                "usage": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7,
                          "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens_details": {"reasoning_tokens": 0}}}
    events: list[dict[str, Any]] = [{"type": "response.created", "sequence_number": 0,
                                     "response": {**response, "status": "in_progress", "output": [], "usage": None}}]
    for index, item in enumerate(output):
        events.append({"type": "response.output_item.added", "sequence_number": len(events), "output_index": index,
                       "item": {**item, "status": "in_progress"}})
        if item["type"] == "function_call":
            events.append({"type": "response.function_call_arguments.delta", "sequence_number": len(events),
                           "item_id": item["id"], "output_index": index, "delta": item["arguments"]})
        events.append({"type": "response.output_item.done", "sequence_number": len(events), "output_index": index,
                       "item": item})
    events.append({"type": "response.completed", "sequence_number": len(events), "response": response})
    return sse(events)


def chat_delta(delta: dict[str, Any]) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def chat_done(reason: str = "tool_calls") -> dict[str, Any]:
    return {**chat_finish(), "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}


# --- the request: tools offered, instructions, determinism -------------------


async def test_responses_offers_the_agents_tools_in_its_shape(raw_llm, fake_definitions):
    fake, client = raw_llm(responses_calls_stream(text="ok"))
    await harness.respond(client, turn(), Recorder())
    body = fake.json()
    assert fake_definitions == [["shell", "read_file"]]
    assert body["tools"] == [
        {"type": "function", "name": "shell", "description": "Run a command.",
         "parameters": DEFINITIONS[0]["parameters"], "strict": False},
        {"type": "function", "name": "read_file", "description": "Read a file.",
         "parameters": DEFINITIONS[1]["parameters"], "strict": False},
    ]
    assert body["instructions"] == "Be brief."


async def test_chat_offers_the_agents_tools_in_its_shape(raw_llm):
    fake, client = raw_llm(sse([chat_delta({"role": "assistant", "content": "ok"}), chat_done("stop")], done=True))
    await harness.chat(client, turn("openai-chat"), Recorder())
    body = fake.json()
    assert body["tools"] == [{"type": "function", "function": DEFINITIONS[0]},
                             {"type": "function", "function": DEFINITIONS[1]}]
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}


@pytest.mark.parametrize("harness_name", ["openai-agents", "openai-chat"])
async def test_without_a_workspace_no_tools_and_the_model_is_told(raw_llm, fake_definitions, harness_name):
    answer = (responses_calls_stream(text="ok") if harness_name == "openai-agents"
              else sse([chat_delta({"content": "ok"}), chat_done("stop")], done=True))
    fake, client = raw_llm(answer)
    await harness.HARNESSES[harness_name](client, turn(harness_name, workspace=None), Recorder())
    body = fake.json()
    assert "tools" not in body and fake_definitions == []
    told = body["instructions"] if harness_name == "openai-agents" else body["messages"][0]["content"]
    assert told == f"Be brief.\n\n{NO_WORKSPACE}"


async def test_an_agent_without_tools_sends_the_request_it_always_did(raw_llm):
    fake, client = raw_llm(responses_calls_stream(text="ok"), responses_calls_stream(text="ok"))
    await harness.respond(client, turn(tools=(), workspace=None), Recorder())
    await harness.respond(client, turn(tools=(), workspace="/w"), Recorder())
    for n in (0, 1):
        assert fake.json(n) == {"model": "m", "input": [USER], "instructions": "Be brief.", "stream": True}


@pytest.mark.parametrize("harness_name", ["openai-agents", "openai-chat"])
async def test_a_repeated_model_step_sends_a_byte_identical_body(raw_llm, harness_name):
    history = [USER, {**CALL, "turn_id": "turn_1"}, OUTPUT]
    answer = (responses_calls_stream(text="ok") if harness_name == "openai-agents"
              else sse([chat_delta({"content": "ok"}), chat_done("stop")], done=True))
    fake, client = raw_llm(answer, answer)
    for _ in range(2):  # e.g. the runner died mid-call and the step went to its replacement
        await harness.HARNESSES[harness_name](client, turn(harness_name, items=json.loads(json.dumps(history)),
                                                           step=1), Recorder())
    first, second = (hashlib.sha256(b).hexdigest() for b in fake.bodies)
    assert first == second


# --- the answer: calls come back as function_call items ------------------------


async def test_responses_function_calls_are_returned_as_received(raw_llm):
    second = {**CALL, "id": "fc_2", "call_id": "call_2", "name": "read_file", "arguments": '{"path": "a"}'}
    fake, client = raw_llm(responses_calls_stream(CALL, second, text="Let me look."))
    emit = Recorder()
    result = await harness.respond(client, turn(), emit)
    assert isinstance(result, TurnCompleted)
    assert [i["type"] for i in result.output] == ["message", "function_call", "function_call"]
    assert {k: result.output[1][k] for k in CALL} == CALL
    assert result.output[2]["call_id"] == "call_2"
    assert emit.types.count("response.output_item.done") == 3


async def test_chat_tool_call_deltas_are_assembled_by_index(raw_llm):
    chunks = [
        chat_delta({"role": "assistant", "content": "Checking."}),
        chat_delta({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                    "function": {"name": "shell", "arguments": ""}}]}),
        chat_delta({"tool_calls": [{"index": 0, "function": {"arguments": '{"comm'}}]}),
        chat_delta({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                                    "function": {"name": "read_file", "arguments": '{"path":'}}]}),
        chat_delta({"tool_calls": [{"index": 0, "function": {"arguments": 'and": "ls"}'}}]}),
        chat_delta({"tool_calls": [{"index": 1, "function": {"arguments": ' "a.txt"}'}}]}),
        chat_done(),
        {**chat_delta({}), "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}},
    ]
    fake, client = raw_llm(sse(chunks, done=True))
    emit = Recorder()
    result = await harness.chat(client, turn("openai-chat"), emit)
    assert isinstance(result, TurnCompleted)
    message, first, second = result.output
    assert message["type"] == "message" and message["content"][0]["text"] == "Checking."
    assert first == {"type": "function_call", "id": "fc_call_a", "call_id": "call_a", "name": "shell",
                     "arguments": '{"command": "ls"}', "status": "completed"}
    assert second == {"type": "function_call", "id": "fc_call_b", "call_id": "call_b", "name": "read_file",
                      "arguments": '{"path": "a.txt"}', "status": "completed"}
    assert [f.event["item"] for f in emit.frames if f.event["type"] == "response.output_item.done"] == result.output
    assert result.usage == {"input_tokens": 5, "output_tokens": 6, "total_tokens": 11}


async def test_chat_tool_calls_without_text_or_ids(raw_llm):
    chunks = [chat_delta({"role": "assistant", "content": None,
                          "tool_calls": [{"index": 0, "type": "function",
                                          "function": {"name": "list_dir", "arguments": None}}]}),
              chat_done()]
    fake, client = raw_llm(sse(chunks, done=True))
    result = await harness.chat(client, turn("openai-chat"), Recorder())
    [call] = result.output
    assert len(call["call_id"]) == 9 and call["call_id"].isalnum() and call["id"] == f"fc_{call['call_id']}"
    assert (call["name"], call["arguments"]) == ("list_dir", "{}")


# --- history to chat messages -------------------------------------------------


def test_calls_become_one_assistant_message_and_outputs_tool_messages():
    text = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "Looking.", "annotations": []}]}
    second = {**CALL, "id": "fc_2", "call_id": "call_2", "name": "read_file", "arguments": '{"path": "a"}'}
    second_out = {**OUTPUT, "call_id": "call_2", "output": "1\thello"}
    final = {**text, "id": "msg_2", "content": [{"type": "output_text", "text": "Done."}]}
    messages = chat_messages("sys", [USER, text, CALL, second, OUTPUT, second_out, final])
    assert messages == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": '{"command": "ls"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a"}'}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt\nexit code: 0"},
        {"role": "tool", "tool_call_id": "call_2", "content": "1\thello"},
        {"role": "assistant", "content": "Done."},
    ]


def test_an_assistant_message_with_calls_and_no_text_is_kept():
    messages = chat_messages(None, [USER, CALL, OUTPUT, {**CALL, "call_id": "call_9"},
                                    {**OUTPUT, "call_id": "call_9"}])
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool"]
    assert messages[1]["content"] is None and messages[1]["tool_calls"][0]["id"] == "call_1"


def test_unpaired_calls_and_outputs_are_left_out_of_chat():
    assert chat_messages(None, [USER, CALL, {**OUTPUT, "call_id": "other"}]) == [{"role": "user", "content": "hi"}]


def test_tool_shapes_are_deterministic():
    assert json.dumps(responses_tools(DEFINITIONS)) == json.dumps(responses_tools(json.loads(json.dumps(DEFINITIONS))))
    assert list(chat_tools(DEFINITIONS)[0]["function"]) == ["name", "description", "parameters"]
