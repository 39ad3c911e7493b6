"""The agent loop's crash points, deterministically: which steps run again and which never do.

Real server pieces (store, hub, registry, turn service and its loop,
`serve_runner`) and the real `Host` with its supervisor, on an autojump
MockClock; the runners are fakes (tests/support/fake_runners.py) that answer
a model step with scripted function calls and a ToolStart with a scripted
result, or die at a chosen point. Steps are numbered per turn: model 0, its
tools 1.., the next model step after them.

Each test counts what every runner was asked (`h.model_steps()`: process,
step, attempt; `h.tool_starts()`: process, step, tool, approval) and what the
store holds, so "a completed model step is never asked again and a
completed tool never run again" is asserted, not assumed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import trio

from omnigent.server.agent_loop import NOT_RUN_INTERRUPTED
from protocol import events as ev
from tests.support.fake_runners import (
    RunnerScript,
    ToolScript,
    TurnScript,
    answers,
    calls,
    open_harness,
)

TIMEOUT = 120
TOOLS = ["shell", "read_file", "write_file", "edit_file", "list_dir", "grep"]
READ = ("read_file", '{"path": "notes.txt"}')
SHELL = ("shell", '{"command": "echo once >> f"}')
SHELL2 = ("shell", '{"command": "echo twice >> g"}')


def session(h, tmp_path, permissions: str = "auto", **spec: Any) -> str:
    return h.new_session(spec={"tools": TOOLS, "permissions": permissions, **spec}, workspace=str(tmp_path))


def steps(h, turn_id: str) -> list[tuple[int, str, str]]:
    return [(s["step"], s["kind"], s["status"]) for s in h.store.steps(turn_id)]


def outputs(h, sid: str, turn_id: str) -> list[tuple[str, str, str]]:
    """The turn's items: (type, call id or text, status); outputs as (type, output, status)."""
    out = []
    for item in h.turns.loop.turn_items(sid, turn_id):
        if item["type"] == "function_call":
            out.append(("call", item["name"], item["status"]))
        elif item["type"] == "function_call_output":
            out.append(("output", item["output"], item["status"]))
        else:
            out.append(("text", item["content"][0]["text"], item["status"]))
    return out


def recovered(h, sid: str) -> list[tuple[int, str, str]]:
    return [(s.event["step"], s.event["kind"], s.event["action"]) for s in h.watches[sid].seen
            if s.type == ev.STEP_RECOVERED]


def request_hash(start) -> str:
    """What the runner's model request is made of: the same hash means a byte-identical request."""
    body = json.dumps({"input": start.input, "agent": start.agent, "model": start.model}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


def ended(h, sid: str, turn_id: str) -> list[str]:
    return [s.type for s in h.watches[sid].seen if s.type in (ev.COMPLETED, ev.FAILED, ev.CANCELLED)
            and s.event.get("turn_id") == turn_id]


async def run_turn(h, sid: str, text: str = "go") -> dict[str, Any]:
    turn = h.post(sid, text)
    await h.until_terminal(sid, turn["id"])
    await h.settle()
    return turn


# --- the model call ------------------------------------------------------------------------


async def test_killed_before_the_model_call_repeats_only_that_step_with_the_same_request(autojump_clock, tmp_path):
    first = RunnerScript(turns=(calls(READ), TurnScript("die", after=0)), tools=(ToolScript(output="A"),))
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [first, answers("done")]) as h:
            await h.online(1)
            sid = session(h, tmp_path)
            turn = await run_turn(h, sid)
            assert h.model_steps() == [(0, 0, 1), (0, 2, 1), (1, 2, 2)]   # step 0 asked once only
            assert h.tool_starts() == [(0, 1, "read_file", "read_only")]   # the tool ran once
            (_, lost), (_, again) = [(t, s) for proc in h.processes for t, s in proc.turns_received if s.step == 2]
            assert request_hash(lost) == request_hash(again)               # byte-identical request
            assert [i.get("type") for i in again.input][-2:] == ["function_call", "function_call_output"]
            assert steps(h, turn["id"]) == [(0, "model", "completed"), (1, "tool", "completed"),
                                            (2, "model", "completed")]
            assert recovered(h, sid) == [(2, "model", "repeated")]
            assert ended(h, sid, turn["id"]) == [ev.COMPLETED]
            assert outputs(h, sid, turn["id"]) == [("call", "read_file", "completed"), ("output", "A", "completed"),
                                                   ("text", "done", "completed")]


async def test_killed_mid_stream_repeats_the_model_step_and_keeps_nothing_of_the_partial(autojump_clock, tmp_path):
    first = RunnerScript(turns=(calls(READ), TurnScript("die", after=0.5, partial="half an ans")),
                         tools=(ToolScript(output="A"),))
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [first, answers("done")]) as h:
            await h.online(1)
            sid = session(h, tmp_path)
            turn = await run_turn(h, sid)
            assert h.model_steps() == [(0, 0, 1), (0, 2, 1), (1, 2, 2)]
            assert h.tool_starts() == [(0, 1, "read_file", "read_only")]
            assert recovered(h, sid) == [(2, "model", "repeated")]
            texts = [o[1] for o in outputs(h, sid, turn["id"]) if o[0] == "text"]
            assert texts == ["done"]  # the dead attempt's partial text is not stored
            completed = next(s.event for s in h.watches[sid].seen if s.type == ev.COMPLETED)
            assert [i["type"] for i in completed["response"]["output"]] == [
                "function_call", "function_call_output", "message"]
            assert completed["response"]["usage"]["total_tokens"] == 6  # two completed model steps


async def test_killed_after_the_model_step_is_stored_never_asks_it_again(autojump_clock, tmp_path):
    first = RunnerScript(turns=(TurnScript("answer", calls=(READ,), text="", die_after=True),))
    second = RunnerScript(tools=(ToolScript(output="A"),), default_turn=TurnScript("answer", text="done"))
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [first, second]) as h:
            await h.online(1)
            sid = session(h, tmp_path)
            turn = await run_turn(h, sid)
            assert h.model_steps() == [(0, 0, 1), (1, 2, 2)]            # step 0 never asked again
            assert h.tool_starts() == [(1, 1, "read_file", "read_only")]  # its tool ran once, on the new runner
            assert steps(h, turn["id"]) == [(0, "model", "completed"), (1, "tool", "completed"),
                                            (2, "model", "completed")]
            assert ended(h, sid, turn["id"]) == [ev.COMPLETED]


# --- a tool step ---------------------------------------------------------------------------


async def test_killed_at_a_side_effecting_tool_start_marks_it_interrupted_and_the_rest_not_run(
        autojump_clock, tmp_path):
    first = RunnerScript(turns=(calls(SHELL, SHELL2),), tools=(ToolScript("die", after=0),))
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [first, answers("done")]) as h:
            await h.online(1)
            sid = session(h, tmp_path)
            turn = await run_turn(h, sid)
            assert h.tool_starts() == [(0, 1, "shell", "auto")]  # never run again, the second never at all
            assert h.model_steps() == [(0, 0, 1), (1, 3, 2)]
            assert steps(h, turn["id"]) == [(0, "model", "completed"), (1, "tool", "interrupted"),
                                            (2, "tool", "not_run"), (3, "model", "completed")]
            got = outputs(h, sid, turn["id"])
            assert got[2][0] == "output" and got[2][1].startswith("interrupted: the runner stopped while this ran")
            assert got[2][2] == "interrupted"
            assert got[3] == ("output", NOT_RUN_INTERRUPTED, "not_run")
            assert recovered(h, sid) == [(1, "tool", "interrupted")]
            (start,) = [s for _, s in h.processes[1].turns_received]
            assert [i.get("type") for i in start.input].count("function_call_output") == 2  # the model sees both
            done = [(s.event["step"], s.event["status"]) for s in h.watches[sid].seen if s.type == ev.TOOL_DONE]
            assert done == [(1, "interrupted"), (2, "not_run")]


async def test_killed_at_a_read_only_tool_start_runs_it_again(autojump_clock, tmp_path):
    first = RunnerScript(turns=(calls(READ),), tools=(ToolScript("die", after=0),))
    second = RunnerScript(tools=(ToolScript(output="A"),), default_turn=TurnScript("answer", text="done"))
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [first, second]) as h:
            await h.online(1)
            sid = session(h, tmp_path)
            turn = await run_turn(h, sid)
            assert h.tool_starts() == [(0, 1, "read_file", "read_only"), (1, 1, "read_file", "read_only")]
            assert h.model_steps() == [(0, 0, 1), (1, 2, 2)]
            assert recovered(h, sid) == [(1, "tool", "rerun")]
            assert steps(h, turn["id"])[1] == (1, "tool", "completed")


async def test_killed_mid_side_effecting_tool_keeps_its_output_so_far_and_never_reruns_it(autojump_clock, tmp_path):
    first = RunnerScript(turns=(calls(SHELL, READ),), tools=(ToolScript("die", after=2, partial="half way\n"),))
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [first, answers("done")]) as h:
            await h.online(1)
            sid = session(h, tmp_path)
            turn = await run_turn(h, sid)
            assert h.tool_starts() == [(0, 1, "shell", "auto")]  # the later read-only call is not run either
            got = outputs(h, sid, turn["id"])
            assert got[2] == ("output", "interrupted: the runner stopped while this ran; the command may or may "
                                        "not have taken effect. Output captured before that:\nhalf way\n",
                              "interrupted")
            assert got[3] == ("output", NOT_RUN_INTERRUPTED, "not_run")
            streamed = [s.event["delta"] for s in h.watches[sid].seen if s.type == ev.TOOL_OUTPUT]
            assert streamed == ["half way\n"]
            assert ended(h, sid, turn["id"]) == [ev.COMPLETED]


async def test_killed_mid_read_only_tool_runs_it_again(autojump_clock, tmp_path):
    first = RunnerScript(turns=(calls(READ),), tools=(ToolScript("die", after=2, partial="line 1\n"),))
    second = RunnerScript(tools=(ToolScript(output="all lines"),), default_turn=TurnScript("answer", text="done"))
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [first, second]) as h:
            await h.online(1)
            sid = session(h, tmp_path)
            turn = await run_turn(h, sid)
            assert h.tool_starts() == [(0, 1, "read_file", "read_only"), (1, 1, "read_file", "read_only")]
            assert outputs(h, sid, turn["id"])[1] == ("output", "all lines", "completed")
            assert recovered(h, sid) == [(1, "tool", "rerun")]


async def test_killed_after_the_tool_result_is_stored_never_runs_it_again(autojump_clock, tmp_path):
    first = RunnerScript(turns=(calls(SHELL),), tools=(ToolScript(output="ran", die_after=True),))
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [first, answers("done")]) as h:
            await h.online(1)
            sid = session(h, tmp_path)
            turn = await run_turn(h, sid)
            assert h.tool_starts() == [(0, 1, "shell", "auto")]
            assert h.model_steps() == [(0, 0, 1), (1, 2, 2)]
            assert steps(h, turn["id"]) == [(0, "model", "completed"), (1, "tool", "completed"),
                                            (2, "model", "completed")]
            assert outputs(h, sid, turn["id"])[1] == ("output", "ran", "completed")
            assert ended(h, sid, turn["id"]) == [ev.COMPLETED]


# --- an approval ----------------------------------------------------------------------------


async def until_event(h, sid: str, type_: str, count: int = 1) -> dict[str, Any]:
    watch = h.watches[sid]
    while sum(s.type == type_ for s in watch.seen) < count:
        await watch.changed.wait()
    return [s.event for s in watch.seen if s.type == type_][count - 1]


async def test_killed_while_waiting_for_an_approval_keeps_the_same_approval(autojump_clock, tmp_path):
    first = RunnerScript(turns=(calls(SHELL),))
    second = RunnerScript(tools=(ToolScript(output="ran"),), default_turn=TurnScript("answer", text="done"))
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [first, second]) as h:
            await h.online(1)
            sid = session(h, tmp_path, permissions="ask")
            turn = h.post(sid, "go")
            asked = await until_event(h, sid, ev.APPROVAL_REQUESTED)
            assert h.turns.status(sid) == "waiting"
            h.processes[0].kill()
            await h.until(lambda: h.processes[-1].runner_id in h.registry.online and len(h.processes) == 2)
            await h.settle()
            assert h.store.get_approval(asked["approval_id"])["status"] == "pending"  # still the same question
            h.store.resolve_approval(asked["approval_id"], "allow", "test")
            h.turns.approval_answered(sid, asked["approval_id"])
            await h.until_terminal(sid, turn["id"])
            await h.settle()
            assert h.tool_starts() == [(1, 1, "shell", "user")]  # ran once, on the new runner, as approved
            assert h.model_steps() == [(0, 0, 1), (1, 2, 2)]
            assert [a["id"] for a in h.store.list_approvals(sid)] == [asked["approval_id"]]
            assert ended(h, sid, turn["id"]) == [ev.COMPLETED]
            resolved = [s.event["decision"] for s in h.watches[sid].seen if s.type == ev.APPROVAL_RESOLVED]
            assert resolved == ["allow"]
