"""Tool calls against a real model server: llama.cpp with an alternation-checking template (`--strict`).

Why: the mock accepts any history; llama.cpp with Mistral Nemo's template
does not. It refuses (HTTP 400) a user message right after tool results, tool
call ids that are not 9 letters and digits, and roles out of turn. This sends
the histories omnigent builds (server/history.py) for the tool loop's cases
through the runner's own harnesses, tools offered, in both harnesses: a model
step in the middle of a turn (after a call and its result), the next turn
after a turn that answered after its tools, and the next turn after one that
failed before its tools ran (the synthetic "not run" output). Protocol only:
every request is answered (the harness returns TurnCompleted, i.e. HTTP 200
and a stream to its end); the model is a tiny base model, its words mean
nothing.

Same server and skip rules as test_real_model_server.py (its `llama`
fixture: `../shared/tools/llama-server`, or a local rebuild).
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from omnigent.runner import harness
from omnigent.server.history import build_history
from omnigent.tools import policy
from protocol import TurnCompleted, TurnStart

from .test_real_model_server import llama  # noqa: F401  (the module-scoped fixture; skips without a server)

pytestmark = pytest.mark.slow

CALL_ID = "Ab3dE6gH9"  # as llama.cpp makes them for this template: 9 letters and digits


def user(text: str, item_id: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "user", "status": "completed",
            "content": [{"type": "input_text", "text": text}]}


def said(text: str, item_id: str, turn_id: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": "completed", "turn_id": turn_id,
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def call(turn_id: str, call_id: str = CALL_ID) -> dict[str, Any]:
    return {"id": f"fc_{call_id}", "type": "function_call", "call_id": call_id, "name": "read_file",
            "arguments": '{"path": "notes.txt"}', "status": "completed", "turn_id": turn_id}


def result(turn_id: str, call_id: str = CALL_ID) -> dict[str, Any]:
    return {"id": f"item_{call_id}", "type": "function_call_output", "call_id": call_id,
            "output": "1\tbuy milk", "status": "completed", "turn_id": turn_id}


CASES = {
    # the loop's second model step: the call and its result, within the turn
    "mid_turn": ([user("What is in notes.txt?", "u1"), said("Let me look.", "m1", "t1"), call("t1"),
                  result("t1")], "u1", "t1"),
    # the next turn after a turn that answered after its tool
    "after_a_tool_turn": ([user("What is in notes.txt?", "u1"), call("t1"), result("t1"),
                           said("It says buy milk.", "m2", "t1"), user("Thanks. Anything else?", "u2")], "u2", "t2"),
    # the next turn after one that failed after its model step: the call was never answered
    "after_a_failed_turn": ([user("What is in notes.txt?", "u1"), call("t1"), user("Are you there?", "u2")],
                            "u2", "t2"),
    # a plain first turn, tools offered
    "tools_offered": ([user("Hello", "u1")], "u1", "t1"),
}


@pytest.fixture
async def client(llama):  # noqa: F811
    async with openai.AsyncOpenAI(base_url=f"{llama}/v1", api_key="any-key", max_retries=0, timeout=120) as c:
        yield c


async def nothing(frame: Any) -> None:
    pass


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("harness_name", ["openai-agents", "openai-chat"])
async def test_tool_histories_are_accepted(client, harness_name, case):
    items, input_id, turn_id = CASES[case]
    history = build_history(items, input_id, turn_id)
    agent = {"name": "reader", "instructions": "You read files for the user.", "harness": harness_name,
             "model": "gemma", "tools": list(policy.TOOL_NAMES)}
    turn = TurnStart(turn_id=turn_id, session_id="conv_1", attempt=1, agent=agent, input=history, model="gemma",
                     step=2 if case == "mid_turn" else 0, workspace="/tmp")
    end = await harness.HARNESSES[harness_name](client, turn, nothing)
    assert isinstance(end, TurnCompleted), end  # a 400 would be an openai.BadRequestError raised here
