"""`-p --output-format`: the text, json and stream-json shapes over a scripted turn's events."""

from __future__ import annotations

import io
import json

import pytest

from omnigent.repl.output import FORMAT_VERSION, Output, dumps, usage_of
from omnigent.repl.render import Console, LiveRenderer
from protocol import events as ev

T = "turn_1"
ARGS = json.dumps({"command": "ls"})


def _msg(text: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def _call(call_id: str = "c1") -> dict:
    return {"type": "function_call", "call_id": call_id, "name": "shell", "arguments": ARGS}


def _out(call_id: str, output: str) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def tool_turn() -> list[dict]:
    """Step 0: text and a shell call; step 1: the tool; step 2: the answer (no deltas, like the mock)."""
    return [
        {"type": ev.RESPONSE_CREATED, "turn_id": T, "attempt": 0},
        {"type": ev.TEXT_DELTA, "turn_id": T, "delta": "Let me "},
        {"type": ev.TEXT_DELTA, "turn_id": T, "delta": "look."},
        {"type": ev.ITEM_DONE, "turn_id": T, "item": _msg("Let me look.")},
        {"type": ev.ITEM_DONE, "turn_id": T, "item": _call()},
        {"type": ev.USAGE, "turn_id": T, "step": 0, "usage": {"input_tokens": 10, "output_tokens": 3},
         "turn": {"input_tokens": 10, "output_tokens": 3, "total_tokens": 13}},
        {"type": ev.TOOL_STARTED, "turn_id": T, "step": 1, "call_id": "c1", "tool": "shell", "arguments": ARGS},
        {"type": ev.TOOL_OUTPUT, "turn_id": T, "call_id": "c1", "delta": "a\nb\n"},
        {"type": ev.TOOL_DONE, "turn_id": T, "step": 1, "call_id": "c1", "tool": "shell", "status": "completed",
         "item": _out("c1", "a\nb\nexit code: 0")},
        {"type": ev.STEP_RECOVERED, "turn_id": T, "step": 2, "kind": "model", "action": "repeated",
         "reason": "the runner stopped during the model call; it is asked again"},
        {"type": ev.ITEM_DONE, "turn_id": T, "item": _msg("Two files.")},
        {"type": ev.USAGE, "turn_id": T, "step": 2, "usage": {"input_tokens": 20, "output_tokens": 4},
         "turn": {"input_tokens": 30, "output_tokens": 7, "total_tokens": 37}},
        {"type": ev.COMPLETED, "turn_id": T, "response": {
            "output": [_msg("Let me look."), _call(), _out("c1", "a\nb\nexit code: 0"), _msg("Two files.")],
            "usage": {"input_tokens": 30, "output_tokens": 7, "total_tokens": 37}}},
    ]


def _run(fmt: str, events: list[dict], status: str = "completed", error: dict | None = None):
    out, err = io.StringIO(), io.StringIO()
    output = Output(fmt, out=out, err=err)
    output.init("conv_1")
    for event in events:
        output.event(event)
    code = output.finish(status=status, error=error, duration_ms=1234.5)
    return code, out.getvalue(), err.getvalue()


def test_text_prints_only_the_final_answer_on_stdout_and_steps_on_stderr():
    code, out, err = _run("text", tool_turn())
    assert code == 0
    assert out == "Two files.\n"
    assert err.splitlines() == [
        "  ⚙ shell: ls",
        "  ↳ a  (+1 line) · exit code 0",
        "recovered: step 2 (model): the runner stopped during the model call; it is asked again",
    ]


def test_json_is_one_versioned_object_with_every_field():
    code, out, err = _run("json", tool_turn())
    assert code == 0 and out.count("\n") == 1
    assert json.loads(out) == {"version": FORMAT_VERSION, "session_id": "conv_1", "result": "Two files.",
                               "is_error": False, "num_steps": 2,
                               "usage": {"input_tokens": 30, "output_tokens": 7, "total_tokens": 37},
                               "duration_ms": 1234}
    assert "⚙" not in err  # tool lines are for text mode; the notice is on stderr in every mode
    assert "recovered:" in err


def test_stream_json_init_first_result_last_exactly_once_and_one_line_per_item():
    code, out, _ = _run("stream-json", tool_turn())
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert lines[0] == {"type": "init", "version": FORMAT_VERSION, "session_id": "conv_1"}
    assert [line["type"] for line in lines].count("init") == 1
    assert [line["type"] for line in lines].count("result") == 1 and lines[-1]["type"] == "result"
    assert [line["type"] for line in lines[1:-1]] == ["text", "text", "tool_call", "tool_result", "incident", "text"]
    assert lines[1:3] == [{"type": "text", "delta": "Let me "}, {"type": "text", "delta": "look."}]
    assert lines[3] == {"type": "tool_call", "call_id": "c1", "tool": "shell", "arguments": ARGS, "step": 1}
    assert lines[4] == {"type": "tool_result", "call_id": "c1", "tool": "shell", "status": "completed",
                        "output": "a\nb\nexit code: 0"}
    assert lines[6] == {"type": "text", "delta": "Two files."}  # sent whole: the model streamed no deltas
    result = dict(lines[-1])
    del result["type"]
    assert result == json.loads(_run("json", tool_turn())[1])


def test_a_failed_turn_is_an_error_in_every_format():
    events = [{"type": ev.RESPONSE_CREATED, "turn_id": T, "attempt": 0},
              {"type": ev.FAILED, "turn_id": T, "error": {"code": "max_steps",
                                                          "message": "stopped after 3 model steps (max_steps)"}}]
    error = events[1]["error"]
    code, out, err = _run("text", events, "failed", error)
    assert (code, out, err) == (1, "", "Error: stopped after 3 model steps (max_steps)\n")
    code, out, _ = _run("json", events, "failed", error)
    assert code == 1 and json.loads(out)["is_error"] is True and json.loads(out)["num_steps"] == 0
    code, out, _ = _run("stream-json", events, "failed", error)
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["type"] for line in lines] == ["init", "result"] and lines[-1]["is_error"] is True


def test_a_call_refused_for_want_of_a_terminal_says_how_to_allow_it_once():
    events = [
        {"type": ev.ITEM_DONE, "turn_id": T, "item": _call("c9")},
        {"type": ev.APPROVAL_REQUESTED, "turn_id": T, "approval_id": "appr_1", "call_id": "c9", "tool": "shell",
         "arguments": ARGS, "step": 1, "target": "ls"},
        {"type": ev.APPROVAL_RESOLVED, "turn_id": T, "approval_id": "appr_1", "call_id": "c9",
         "decision": "timeout", "by": "timeout"},
        {"type": ev.APPROVAL_RESOLVED, "turn_id": T, "approval_id": "appr_1", "call_id": "c9",
         "decision": "timeout", "by": "timeout"},
        {"type": ev.TOOL_DONE, "turn_id": T, "step": 1, "call_id": "c9", "tool": "shell", "status": "not_approved",
         "item": _out("c9", "not approved: nobody could be asked")},
        {"type": ev.ITEM_DONE, "turn_id": T, "item": _msg("I could not run it.")},
        {"type": ev.COMPLETED, "turn_id": T, "response": {"output": []}},
    ]
    code, out, err = _run("text", events)
    assert code == 0 and out == "I could not run it.\n"
    line = ("omnigent: shell call not approved (no terminal to ask); "
            "rerun with --permission-mode auto to allow it")
    assert err.splitlines() == ["  ⚙ shell: ls", line, "  ↳ not approved: nobody could be asked"]
    code, out, err = _run("stream-json", events)
    kinds = [json.loads(x)["type"] for x in out.splitlines()]
    assert kinds == ["init", "tool_call", "incident", "tool_result", "text", "result"]
    assert json.loads(out.splitlines()[3])["status"] == "not_approved"
    assert err.count(line) == 1


def test_usage_of_reads_both_harnesses_and_json_escapes_c1():
    assert usage_of({"prompt_tokens": 3, "completion_tokens": 2}) == {
        "input_tokens": 3, "output_tokens": 2, "total_tokens": 5}
    assert usage_of(None) == {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
    assert dumps({"t": "\x1b\x9bé"}) == '{"t": "\\u001b\\u009bé"}'


def test_unknown_format_is_refused():
    with pytest.raises(ValueError):
        Output("yaml")


def test_the_repl_shows_each_call_and_result_once_and_no_live_output():
    out, err = io.StringIO(), io.StringIO()
    renderer = LiveRenderer(Console(tty=False, out=out, err=err))
    for event in tool_turn():
        renderer.event(event)
    assert out.getvalue().splitlines() == ["Let me look.", "  ⚙ shell: ls", "  ↳ a  (+1 line) · exit code 0", "Two files."]
    assert err.getvalue() == "recovered: step 2 (model): the runner stopped during the model call; it is asked again\n"


def test_a_call_shown_in_the_transcript_is_not_announced_again_by_its_events():
    out, err = io.StringIO(), io.StringIO()
    renderer = LiveRenderer(Console(tty=False, out=out, err=err))
    renderer.calls.seen([_call("c1")])  # printed with the transcript on resume
    renderer.event({"type": ev.TOOL_STARTED, "turn_id": T, "step": 1, "call_id": "c1", "tool": "shell",
                    "arguments": ARGS})
    renderer.event({"type": ev.TOOL_DONE, "turn_id": T, "step": 1, "call_id": "c1", "tool": "shell",
                    "status": "interrupted", "item": _out("c1", "interrupted: the runner stopped")})
    renderer.event({"type": ev.TOOL_DONE, "turn_id": T, "step": 2, "call_id": "c2", "tool": "shell",
                    "status": "not_run", "item": _out("c2", "not run: an earlier call was interrupted")})
    assert out.getvalue().splitlines() == ["  ↳ interrupted: the runner stopped",
                                           "  ↳ not run: an earlier call was interrupted"]


def test_a_call_that_never_started_is_shown_with_its_arguments_and_its_step():
    events = [{"type": ev.ITEM_DONE, "turn_id": T, "item": _call("c5")},
              {"type": ev.TOOL_DONE, "turn_id": T, "step": 1, "call_id": "c5", "tool": "shell",
               "status": "not_approved", "item": _out("c5", "not approved: the permission mode is deny")},
              {"type": ev.COMPLETED, "turn_id": T, "response": {"output": [_msg("Denied.")]}}]
    code, out, err = _run("text", events)
    assert (code, out) == (0, "Denied.\n")
    assert err.splitlines() == ["  ⚙ shell: ls", "  ↳ not approved: the permission mode is deny"]
    lines = [json.loads(x) for x in _run("stream-json", events)[1].splitlines()]
    assert lines[1] == {"type": "tool_call", "call_id": "c5", "tool": "shell", "arguments": ARGS, "step": 1}
