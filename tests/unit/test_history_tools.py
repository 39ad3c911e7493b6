"""Histories with tool steps (omnigent/server/history.py, issue 9 "Well-formed histories").

Why: a model step of a running turn must see the turn's earlier steps; a
call whose turn failed before its tool ran must still be answered (both APIs
refuse an unanswered call, and such a transcript would break resume for
good: Claude Code #2105, #3995); and omnigent's own statuses never reach a
provider.
"""

from __future__ import annotations

from omnigent.runner.wire import chat_messages
from omnigent.server.history import NO_ANSWER, NOT_RUN_FAILED, build_history

from .test_history import answer, user


def call(call_id: str, turn_id: str = "turn_1", name: str = "shell") -> dict:
    return {"id": f"fc_{call_id}", "type": "function_call", "call_id": call_id, "name": name,
            "arguments": '{"command": "ls"}', "status": "completed", "response_id": "resp_1", "created_at": 3.0,
            "turn_id": turn_id}


def output(call_id: str, text: str = "ok", status: str = "completed", turn_id: str = "turn_1") -> dict:
    return {"id": f"item_{call_id}", "type": "function_call_output", "call_id": call_id, "output": text,
            "status": status, "response_id": None, "created_at": 4.0, "turn_id": turn_id}


def kinds(items: list[dict]) -> list[str]:
    return [i.get("role") or i["type"] for i in items]


def test_the_turns_own_earlier_steps_are_sent():
    items = [user("q", "u1"), call("c1"), output("c1"), {**answer("thinking", "msg_2"), "turn_id": "turn_1"}]
    assert kinds(build_history(items, "u1")) == ["user"]  # without the turn: as before
    history = build_history(items, "u1", "turn_1")
    assert kinds(history) == ["user", "function_call", "function_call_output", "assistant"]
    assert history[1] == {"id": "fc_c1", "type": "function_call", "call_id": "c1", "name": "shell",
                          "arguments": '{"command": "ls"}', "status": "completed"}
    assert history[2] == {"type": "function_call_output", "call_id": "c1", "output": "ok"}


def test_other_turns_and_later_messages_are_not_sent():
    items = [user("q1", "u1"), call("c1"), output("c1"), call("x", turn_id="turn_0"), output("x", turn_id="turn_0"),
             user("q2", "u2"), call("c2", turn_id="turn_2")]
    assert kinds(build_history(items, "u1", "turn_1")) == ["user", "function_call", "function_call_output"]


def test_items_without_a_turn_id_after_the_message_are_the_turns():
    bare = {k: v for k, v in call("c1").items() if k != "turn_id"}
    out = {k: v for k, v in output("c1").items() if k != "turn_id"}
    assert kinds(build_history([user("q", "u1"), bare, out, user("q2", "u2")], "u1", "turn_1")) == [
        "user", "function_call", "function_call_output"]


def test_an_unanswered_call_gets_a_synthetic_output_after_its_steps_calls():
    # turn_0 failed after its model step: neither call has an output stored
    items = [user("q1", "u1"), call("a", "turn_0"), call("b", "turn_0"), user("q2", "u2")]
    history = build_history(items, "u2")
    assert kinds(history) == ["user", "function_call", "function_call", "function_call_output",
                              "function_call_output", "assistant", "user"]
    assert [(i["call_id"], i["output"]) for i in history[3:5]] == [("a", NOT_RUN_FAILED), ("b", NOT_RUN_FAILED)]
    assert history[0]["content"][0]["text"] == "q1"  # answered by the calls: not merged into q2
    # the turn is closed before the next user message (alternation-checking templates skip tool turns)
    assert history[5] == {"type": "message", "role": "assistant", "content": NO_ANSWER}


def test_a_turn_that_answered_after_its_tools_needs_no_closing():
    items = [user("q1", "u1"), call("a", "turn_0"), output("a", turn_id="turn_0"),
             {**answer("done", "msg_d"), "turn_id": "turn_0"}, user("q2", "u2")]
    assert kinds(build_history(items, "u2")) == ["user", "function_call", "function_call_output", "assistant",
                                                 "user"]


def test_only_the_missing_outputs_are_made_up():
    items = [user("q", "u1"), call("a"), call("b"), output("a")]
    history = build_history(items, "u1", "turn_1")
    assert [(i["type"], i["call_id"]) for i in history[1:]] == [
        ("function_call", "a"), ("function_call", "b"), ("function_call_output", "b"), ("function_call_output", "a")]
    assert history[3]["output"] == NOT_RUN_FAILED and history[4]["output"] == "ok"


def test_an_output_without_its_call_is_left_out():
    assert kinds(build_history([user("q", "u1"), output("ghost")], "u1", "turn_1")) == ["user"]


def test_stored_statuses_go_as_the_item_with_no_status_field():
    items = [user("q", "u1"), call("a"), output("a", "interrupted: the runner stopped ...", "interrupted"),
             call("b"), output("b", "cancelled by the user. Output so far:\n", "cancelled"),
             call("c"), output("c", "not run: an earlier call of this step was interrupted", "not_run")]
    outputs = [i for i in build_history(items, "u1", "turn_1") if i.get("type") == "function_call_output"]
    assert [set(i) for i in outputs] == [{"type", "call_id", "output"}] * 3
    assert outputs[0]["output"].startswith("interrupted")


def test_a_synthesised_history_converts_to_valid_chat():
    items = [user("q1", "u1"), answer("Let me check.", "msg_1"), call("a", "turn_0"), user("q2", "u2")]
    messages = chat_messages(None, build_history(items, "u2"))
    assert messages == [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "shell", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "a", "content": NOT_RUN_FAILED},
        {"role": "assistant", "content": NO_ANSWER},
        {"role": "user", "content": "q2"},
    ]
