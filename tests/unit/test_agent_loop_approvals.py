"""Approvals, permission modes, step limits and cancels of the agent loop, on a MockClock.

The loop asks before a side-effecting call under "ask" (`approval_waits.py`):
an approval row, `session.approval.requested`, session.status "waiting",
then the answer (any client, through the API route: first answer wins,
later 409) or the turn's `approval_timeout` on trio's clock. Fake runners
as in test_agent_loop_crashes.py; answers go through the real API route
(quart's test client on the same ServerState) or straight to the store
and `TurnService.approval_answered`, as the route does.
"""

from __future__ import annotations

from typing import Any

import trio

from omnigent.server.agent_loop import NOT_RUN_CANCELLED, NOT_RUN_LIMIT
from omnigent.server.app import create_app
from protocol import events as ev
from tests.support.fake_runners import RunnerScript, ToolScript, TurnScript, calls, open_harness

from .test_agent_loop_crashes import SHELL, SHELL2, ended, outputs, session, steps, until_event

TIMEOUT = 120
WRITE = ("write_file", '{"path": "a.txt", "content": "hi"}')
HEADERS = {"Authorization": "Bearer t", "Origin": "omnigent://internal"}


def script(*turns: TurnScript, tools: tuple[ToolScript, ...] = ()) -> RunnerScript:
    return RunnerScript(turns=turns, tools=tools, default_turn=TurnScript("answer", text="done"))


def answer(h, sid: str, approval_id: str, decision: str) -> None:
    """What the API route does with an answer: store it, then wake the loop."""
    assert h.store.resolve_approval(approval_id, decision, "test") is not None
    h.turns.approval_answered(sid, approval_id)


def resolved(h, sid: str) -> list[tuple[str, str]]:
    return [(s.event["decision"], s.event["by"]) for s in h.watches[sid].seen if s.type == ev.APPROVAL_RESOLVED]


def statuses(h, sid: str) -> list[str]:
    return [s.event["status"] for s in h.watches[sid].seen if s.type == ev.SESSION_STATUS]


async def test_allow_runs_the_call_as_approved_and_the_session_waits_meanwhile(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [script(calls(SHELL))]) as h:
            await h.online(1)
            sid = session(h, tmp_path, permissions="ask")
            turn = h.post(sid, "go")
            asked = await until_event(h, sid, ev.APPROVAL_REQUESTED)
            assert (asked["tool"], asked["target"], asked["step"], asked["arguments"]) == (
                "shell", "echo once >> f", 1, SHELL[1])
            assert h.turns.status(sid) == "waiting" and statuses(h, sid)[-1] == "waiting"
            assert h.tool_starts() == []  # nothing runs before the answer
            await trio.sleep(100)  # no timeout given: it waits as long as it takes
            answer(h, sid, asked["approval_id"], "allow")
            await h.until_terminal(sid, turn["id"])
            await h.settle()
            assert h.tool_starts() == [(0, 1, "shell", "user")]
            assert resolved(h, sid) == [("allow", "test")]
            assert statuses(h, sid) == ["running", "waiting", "running", "idle"]
            assert ended(h, sid, turn["id"]) == [ev.COMPLETED]


async def test_deny_stores_not_approved_and_the_loop_goes_on(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [script(calls(SHELL))]) as h:
            await h.online(1)
            sid = session(h, tmp_path, permissions="ask")
            turn = h.post(sid, "go")
            asked = await until_event(h, sid, ev.APPROVAL_REQUESTED)
            answer(h, sid, asked["approval_id"], "deny")
            await h.until_terminal(sid, turn["id"])
            await h.settle()
            assert h.tool_starts() == []
            assert outputs(h, sid, turn["id"])[1] == ("output", "not approved: the user denied this call", "completed")
            done = [s.event["status"] for s in h.watches[sid].seen if s.type == ev.TOOL_DONE]
            assert done == ["not_approved"]
            assert [s[0] for s in h.model_steps()] == [0, 0] and ended(h, sid, turn["id"]) == [ev.COMPLETED]


async def test_always_adds_a_rule_and_the_same_call_later_runs_without_asking(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [script(calls(SHELL), calls(SHELL), calls(SHELL2))]) as h:
            await h.online(1)
            sid = session(h, tmp_path, permissions="ask")
            turn = h.post(sid, "go")
            asked = await until_event(h, sid, ev.APPROVAL_REQUESTED)
            answer(h, sid, asked["approval_id"], "always")
            other = await until_event(h, sid, ev.APPROVAL_REQUESTED, count=2)  # another command: asked
            assert other["target"] == "echo twice >> g"
            answer(h, sid, other["approval_id"], "allow")
            await h.until_terminal(sid, turn["id"])
            await h.settle()
            assert h.tool_starts() == [(0, 1, "shell", "user"), (0, 3, "shell", "user"), (0, 5, "shell", "user")]
            assert [(r["tool"], r["target"]) for r in h.store.list_rules(sid)] == [("shell", "echo once >> f")]
            assert len(h.store.list_approvals(sid)) == 2


async def test_a_timeout_refuses_the_call_on_the_virtual_clock(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [script(calls(SHELL))]) as h:
            await h.online(1)
            sid = session(h, tmp_path, permissions="ask")
            turn = h.post(sid, "go", approval_timeout=30)
            asked = await until_event(h, sid, ev.APPROVAL_REQUESTED)
            start = trio.current_time()
            await until_event(h, sid, ev.APPROVAL_RESOLVED)
            assert trio.current_time() - start == 30
            await h.until_terminal(sid, turn["id"])
            await h.settle()
            assert resolved(h, sid) == [("timeout", "server")]
            assert h.store.get_approval(asked["approval_id"])["status"] != "pending"
            assert outputs(h, sid, turn["id"])[1][1].startswith("not approved: nobody answered")
            assert h.tool_starts() == [] and ended(h, sid, turn["id"]) == [ev.COMPLETED]


async def test_a_zero_timeout_refuses_at_once_and_the_turn_still_finishes(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [script(calls(SHELL))]) as h:
            await h.online(1)
            sid = session(h, tmp_path, permissions="ask")
            turn = h.post(sid, "go", approval_timeout=0)
            await h.until_terminal(sid, turn["id"])
            await h.settle()
            assert trio.current_time() == 2  # two model steps of 1 s: no wait at all
            assert resolved(h, sid) == [("timeout", "server")]
            assert h.tool_starts() == [] and ended(h, sid, turn["id"]) == [ev.COMPLETED]


async def test_cancel_during_an_approval_cancels_it_and_the_turn(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [script(calls(SHELL, SHELL2))]) as h:
            await h.online(1)
            sid = session(h, tmp_path, permissions="ask")
            turn = h.post(sid, "go")
            asked = await until_event(h, sid, ev.APPROVAL_REQUESTED)
            assert await h.turns.interrupt(sid)
            await h.until_terminal(sid, turn["id"])
            await h.settle()
            assert h.store.get_approval(asked["approval_id"])["status"] == "cancelled"
            assert resolved(h, sid) == [("cancelled", "user")]
            assert steps(h, turn["id"]) == [(0, "model", "completed"), (1, "tool", "cancelled"), (2, "tool", "not_run")]
            assert outputs(h, sid, turn["id"])[3] == ("output", NOT_RUN_CANCELLED, "not_run")
            assert ended(h, sid, turn["id"]) == [ev.CANCELLED] and h.tool_starts() == []
            assert [s[1] for s in h.model_steps()] == [0]  # no further model call


async def test_cancel_during_a_tool_stores_its_output_and_ends_the_turn(autojump_clock, tmp_path):
    first = script(calls(SHELL, SHELL2), tools=(ToolScript("wait", partial="tick\n"),))
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [first]) as h:
            await h.online(1)
            sid = session(h, tmp_path)
            turn = h.post(sid, "go")
            await until_event(h, sid, ev.TOOL_OUTPUT)
            assert await h.turns.interrupt(sid)
            await h.until_terminal(sid, turn["id"])
            await h.settle()
            got = outputs(h, sid, turn["id"])
            assert got[2] == ("output", "cancelled by the user. Output so far:\ntick\n", "cancelled")
            assert got[3] == ("output", NOT_RUN_CANCELLED, "not_run")
            assert h.tool_starts() == [(0, 1, "shell", "auto")] and [s[1] for s in h.model_steps()] == [0]
            assert ended(h, sid, turn["id"]) == [ev.CANCELLED]


async def test_deny_mode_runs_no_side_effecting_call_but_read_only_ones(autojump_clock, tmp_path):
    read = ("grep", '{"pattern": "x"}')
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [script(calls(SHELL, read))]) as h:
            await h.online(1)
            sid = session(h, tmp_path, permissions="deny")
            turn = h.post(sid, "go")
            await h.until_terminal(sid, turn["id"])
            await h.settle()
            assert h.tool_starts() == [(0, 2, "grep", "read_only")]
            assert outputs(h, sid, turn["id"])[2] == ("output", "not approved: the permission mode is deny", "completed")
            assert h.store.list_approvals(sid) == []


async def test_a_host_policy_caps_the_session_mode(autojump_clock, tmp_path):
    """A bundle that says auto still asks on a host whose policy is ask (strictest wins)."""
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [script(calls(SHELL))], local_permissions="ask") as h:
            await h.online(1)
            sid = session(h, tmp_path, permissions="auto")
            turn = h.post(sid, "go", approval_timeout=0)
            await h.until_terminal(sid, turn["id"])
            await h.settle()
            assert resolved(h, sid) == [("timeout", "server")] and h.tool_starts() == []


async def test_write_file_is_previewed_and_the_question_carries_the_diff(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [script(calls(WRITE))]) as h:
            await h.online(1)
            sid = session(h, tmp_path, permissions="ask")
            turn = h.post(sid, "go")
            asked = await until_event(h, sid, ev.APPROVAL_REQUESTED)
            assert asked["diff"].startswith("--- a/write_file") and asked["target"] == "a.txt"
            answer(h, sid, asked["approval_id"], "allow")
            await h.until_terminal(sid, turn["id"])
            await h.settle()
            assert h.tool_starts(previews=True) == [(0, 1, "write_file", "preview"), (0, 1, "write_file", "user")]


async def test_the_step_limit_ends_the_turn_with_its_calls_not_run(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [script(calls(SHELL), calls(SHELL2))]) as h:
            await h.online(1)
            sid = session(h, tmp_path, max_steps=2)
            turn = h.post(sid, "go")
            await h.until_terminal(sid, turn["id"])
            await h.settle()
            assert h.tool_starts() == [(0, 1, "shell", "auto")]
            assert outputs(h, sid, turn["id"])[-1] == ("output", NOT_RUN_LIMIT, "not_run")
            (failed,) = [s.event for s in h.watches[sid].seen if s.type == ev.FAILED]
            assert failed["error"] == {"code": "max_steps", "message": "stopped after 2 model steps (max_steps)"}


async def test_the_api_route_answers_once_and_a_second_answer_is_409(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [script(calls(SHELL))]) as h:
            await h.online(1)
            client = create_app(h.state).test_client()
            sid = session(h, tmp_path, permissions="ask")
            turn = h.post(sid, "go")
            asked = await until_event(h, sid, ev.APPROVAL_REQUESTED)
            body: dict[str, Any] = {"type": "approval", "data": {"approval_id": asked["approval_id"],
                                                                 "decision": "allow"}}
            first = await client.post(f"/v1/sessions/{sid}/events", json=body, headers=HEADERS)
            assert first.status_code == 200, await first.get_data()
            body["data"]["decision"] = "deny"
            second = await client.post(f"/v1/sessions/{sid}/events", json=body, headers=HEADERS)
            assert second.status_code == 409
            assert (await second.get_json())["error"]["code"] == "already_resolved"
            await h.until_terminal(sid, turn["id"])
            await h.settle()
            assert h.tool_starts() == [(0, 1, "shell", "user")]
            assert [d for d, _ in resolved(h, sid)] == ["allow"]  # one resolution, the first answer's
