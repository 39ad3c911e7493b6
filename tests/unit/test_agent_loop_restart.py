"""The agent loop after a server restart, on a MockClock: adopted tool steps, unclaimed ones, approvals.

What a server killed mid-turn leaves in the store (a turn running at a
tool step, or waiting for an approval), a new server's pieces on the same
store (`TurnService.take_over`), and hand-driven runners (test_adoption.py's
`HandRunner`). A daemon's runner that still runs the tool claims its step
in its hello and the loop follows that step to its end; a step nobody
claims is recovered from the store; an approval asked by the dead server is
void: expired, and asked again.
"""

from __future__ import annotations

import trio

import protocol as p
from omnigent.link.runner_secrets import hash_secret
from omnigent.store import Store
from protocol import events as ev
from tests.support.fake_runners import collect_until_terminal

from .test_adoption import GRACE, HandRunner, _server

SHELL_ARGS = '{"command": "echo once >> f"}'


def _leftovers(store: Store, *, waiting: bool = False, permissions: str = "auto") -> tuple[str, str]:
    """A turn of a dead server at tool step 1 (a shell call of model step 0): running, or waiting
    for an approval; its runner R is a daemon's. Returns (session id, turn id)."""
    store.add_runner_credential("runner_r", hash_secret("secret-runner_r"), kind="host", host_id="host_d")
    agent = store.upsert_agent("helper", {"name": "helper", "model": "m", "tools": ["shell"],
                                          "permissions": permissions})
    sid = store.create_conversation(agent_id=agent["id"])["id"]
    store.set_runner(sid, "runner_r")  # generation 1
    item = store.append_item(sid, {"type": "message", "role": "user", "content": "hi"})
    turn = store.create_turn(sid, item["id"], owner_pid=999_999)["id"]
    store.start_turn(turn, "runner_r", 999_999, generation=1)
    store.begin_step(sid, turn, 0, "model", attempt=1)
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "shell",
            "arguments": SHELL_ARGS, "status": "completed"}
    store.finish_model_step(sid, turn, 0, [call], "resp_0", {"total_tokens": 2})
    store.begin_step(sid, turn, 1, "tool", call_id="call_1", tool="shell", arguments=SHELL_ARGS, attempt=1)
    if waiting:
        store.set_step_waiting(turn, 1, True)
        store.create_approval(sid, turn, 1, "call_1", "shell", SHELL_ARGS, "echo once >> f", None, None)
    else:  # what the tool streamed before the server died is in the event log
        store.append_events(sid, [ev.make_event(ev.TOOL_OUTPUT, turn_id=turn, call_id="call_1",
                                                delta="partial out\n", session_id=sid)])
    return sid, turn


def _outputs(store: Store, sid: str) -> list[tuple[str, str]]:
    return [(i["output"], i["status"]) for i in store.list_items(sid) if i["type"] == "function_call_output"]


async def test_a_tool_step_claimed_by_its_runner_is_followed_to_its_end_and_not_run_again(autojump_clock, tmp_path):
    store = Store(tmp_path / "chat.db")
    sid, tid = _leftovers(store)
    async with _server(store) as (state, nursery):
        r = HandRunner(state, "runner_r", nursery)
        await trio.sleep(1)
        await r.hello([{"turn_id": tid, "attempt": 1, "generation": 1, "step": 1}])
        r.send(p.ToolResult(tid, "call_1", "completed", "once\nexit code: 0"))
        start = await r.recv()  # the next model step, on the same runner
        assert isinstance(start, p.TurnStart) and (start.step, start.attempt) == (2, 1)
        assert [i.get("type") for i in start.input][-2:] == ["function_call", "function_call_output"]
        r.answer(tid, "done")
        await collect_until_terminal(state.hub, sid, tid)
        await trio.testing.wait_all_tasks_blocked()
        assert not [f for f in r.got if isinstance(f, (p.ToolStart, p.Cancel))]  # nothing run again
        assert _outputs(store, sid) == [("once\nexit code: 0", "completed")]
        assert [(s["step"], s["status"]) for s in store.steps(tid)] == [(0, "completed"), (1, "completed"),
                                                                       (2, "completed")]
        assert store.get_turn(tid)["status"] == "completed"
    store.close()


async def test_a_claim_of_another_step_is_refused(autojump_clock, tmp_path):
    store = Store(tmp_path / "chat.db")
    sid, tid = _leftovers(store)
    async with _server(store) as (state, nursery):
        r = HandRunner(state, "runner_r", nursery)
        await r.hello([{"turn_id": tid, "attempt": 1, "generation": 1, "step": 0}])  # an old step
        assert await r.recv() == p.Cancel(tid)
    store.close()


async def test_an_unclaimed_side_effecting_step_is_interrupted_with_its_logged_output(autojump_clock, tmp_path):
    store = Store(tmp_path / "chat.db")
    sid, tid = _leftovers(store)
    async with _server(store) as (state, nursery):
        s = HandRunner(state, "runner_s", nursery)
        await s.hello()
        start = await s.recv()  # after the grace: the next model step, the shell never run again
        assert trio.current_time() >= GRACE
        assert isinstance(start, p.TurnStart) and (start.step, start.attempt) == (2, 2)
        s.answer(tid, "done")
        seen = await collect_until_terminal(state.hub, sid, tid)
        assert _outputs(store, sid) == [(
            "interrupted: the runner stopped while this ran; the command may or may not have taken effect. "
            "Output captured before that:\npartial out\n", "interrupted")]
        assert [(e.event["step"], e.event["action"]) for e in seen if e.type == ev.STEP_RECOVERED] == [
            (1, "interrupted")]
        assert not [f for f in s.got if isinstance(f, p.ToolStart)]
    store.close()


async def test_an_approval_of_the_dead_server_expires_and_is_asked_again(autojump_clock, tmp_path):
    store = Store(tmp_path / "chat.db")
    sid, tid = _leftovers(store, waiting=True, permissions="ask")
    (old,) = store.list_approvals(sid)
    with trio.fail_after(120):
        await _asked_again(store, sid, tid, old)
    store.close()


async def _asked_again(store: Store, sid: str, tid: str, old: dict) -> None:
    async with _server(store) as (state, nursery):
        s = HandRunner(state, "runner_s", nursery)
        await s.hello()
        seen: list = []

        async def answer_when_asked() -> None:  # a client watching the session
            async for event in state.hub.follow(sid, after=0):
                seen.append(event)
                if event["type"] == ev.APPROVAL_REQUESTED:
                    store.resolve_approval(event["approval_id"], "allow", "test")
                    state.turns.approval_answered(sid, event["approval_id"])
                    return

        nursery.start_soon(answer_when_asked)
        tool = await s.recv()  # (answering pings meanwhile)
        assert isinstance(tool, p.ToolStart) and (tool.step, tool.approval, tool.call_id) == (1, "user", "call_1")
        (asked,) = [e for e in seen if e["type"] == ev.APPROVAL_REQUESTED]
        assert asked["approval_id"] != old["id"] and asked["step"] == 1
        assert store.get_approval(old["id"])["status"] == "expired"
        recovered = [(e["step"], e["kind"], e["action"]) for e in seen if e["type"] == ev.STEP_RECOVERED]
        assert recovered == [(1, "approval", "asked_again")]
        s.send(p.ToolResult(tid, "call_1", "completed", "ran"))
        start = await s.recv()
        assert isinstance(start, p.TurnStart) and start.step == 2
        s.answer(tid, "done")
        await collect_until_terminal(state.hub, sid, tid)
        assert _outputs(store, sid) == [("ran", "completed")]
