"""Approvals, permissions, usage and retry over the API, through the SDK, on a real in-process server.

The agent loop (server/agent_loop.py) is what creates approvals and steps;
here the store stands in for it (the same file the server uses), so these
tests pin the routes' own promises: the first answer wins (later ones 409
`already_resolved`), every bad input is one 4xx JSON error, the answer and
its event commit together and wake the loop, "always" stores a rule that
can be listed and revoked, a message's `approval_timeout` lands on its turn,
and `retry` of an interrupted turn with steps requeues that same turn.
"""

from __future__ import annotations

import httpx
import pytest

from omnigent.agents import bundle_bytes
from omnigent.client import NOT_GIVEN, ConflictError, InvalidInputError, NotFoundError, OmnigentClient
from omnigent.server.serve import run_server
from omnigent.server.sockets import bind_socket
from omnigent.store import Store

AGENT_YAML = "name: approvals_agent\nprompt: be brief\nexecutor:\n  harness: openai-chat\n  model: m1\n"
ORIGIN = {"Origin": "omnigent://internal"}


@pytest.fixture
async def server(nursery, tmp_path):
    store = Store(tmp_path / "chat.db")
    handle = await nursery.start(lambda task_status: run_server(
        store, bind_socket(), token=None, runner_wait=0.5, task_status=task_status))
    handle.store = store
    yield handle
    await handle.aclose()
    store.close()


@pytest.fixture
async def client(server):
    async with OmnigentClient(server.url) as client:
        yield client


@pytest.fixture
def bundle(tmp_path) -> bytes:
    path = tmp_path / "agent.yaml"
    path.write_text(AGENT_YAML)
    return bundle_bytes(path)


@pytest.fixture
async def session(client, bundle) -> dict:
    return await client.create_session(bundle, workspace="/tmp")


def pending(server, session: dict, tool: str = "shell", target: str = "make clean") -> dict:
    """What the loop does when a side-effecting call needs an answer."""
    return server.store.create_approval(session["id"], "turn_x", 1, "call_1", tool, '{"command": "make clean"}',
                                        target, None, None)


async def test_the_first_answer_wins_and_wakes_the_loop(server, client, session):
    woken = []
    server.state.turns.approval_answered = lambda sid, aid: woken.append((sid, aid))  # it publishes, here not
    approval = pending(server, session)
    assert [a["id"] for a in await client.sessions.approvals(session["id"], status="pending")] == [approval["id"]]
    after = server.store.last_event_seq(session["id"])

    answer = await client.sessions.approve(session["id"], approval["id"], "allow")
    assert answer == {"approval_id": approval["id"], "decision": "allow", "status": "allowed"}
    assert woken == [(session["id"], approval["id"])]
    with pytest.raises(ConflictError) as info:
        await client.sessions.approve(session["id"], approval["id"], "deny")
    assert info.value.code == "already_resolved" and info.value.status_code == 409
    assert woken == [(session["id"], approval["id"])]  # a refused answer wakes nothing
    assert server.store.get_approval(approval["id"])["decision"] == "allow"
    assert await client.sessions.approvals(session["id"], status="pending") == []
    [listed] = await client.sessions.approvals(session["id"])
    assert (listed["status"], listed["decided_by"]) == ("allowed", "client")
    assert server.store.read_events(session["id"], after) == []  # the hook's to publish


async def test_answers_work_without_a_loop_to_wake(server, client, session, monkeypatch):
    monkeypatch.setattr(server.state.turns, "approval_answered", None, raising=False)  # a server without the hook
    approval = pending(server, session)
    after = server.store.last_event_seq(session["id"])
    assert (await client.sessions.approve(session["id"], approval["id"], "allow"))["status"] == "allowed"
    [event] = server.store.read_events(session["id"], after)
    assert event["type"] == "session.approval.resolved"
    assert {k: event[k] for k in ("turn_id", "approval_id", "call_id", "decision", "by")} == {
        "turn_id": "turn_x", "approval_id": approval["id"], "call_id": "call_1", "decision": "allow", "by": "client"}




async def test_bad_answers_are_4xx_json(server, client, session, bundle):
    approval = pending(server, session)
    other = await client.create_session(bundle)
    with pytest.raises(NotFoundError):
        await client.sessions.approve(session["id"], "appr_nope", "allow")
    with pytest.raises(NotFoundError):  # an approval of another session
        await client.sessions.approve(other["id"], approval["id"], "allow")
    with pytest.raises(NotFoundError):
        await client.sessions.approve("conv_nope", approval["id"], "allow")
    for decision in ("yes", "timeout", "", None, 1):
        with pytest.raises(InvalidInputError):
            await client.sessions.approve(session["id"], approval["id"], decision)  # type: ignore[arg-type]
    async with httpx.AsyncClient(base_url=server.url, headers=ORIGIN) as http:
        for data in (None, [], "x", {}, {"approval_id": 5, "decision": "allow"},
                     {"approval_id": approval["id"], "decision": "allow", "by": ""},
                     {"approval_id": approval["id"], "decision": "allow", "by": "x" * 101}):
            resp = await http.post(f"/v1/sessions/{session['id']}/events", json={"type": "approval", "data": data})
            assert resp.status_code == 400, data
            assert set(resp.json()["error"]) == {"code", "message"}
        resp = await http.get(f"/v1/sessions/{session['id']}/approvals", params={"status": "open"})
        assert resp.status_code == 400
        for path in ("approvals", "permissions"):
            assert (await http.get(f"/v1/sessions/conv_nope/{path}")).status_code == 404
    assert server.store.get_approval(approval["id"])["status"] == "pending"


async def test_always_stores_a_rule_that_can_be_revoked(server, client, session):
    approval = pending(server, session, target="make test")
    await client.sessions.approve(session["id"], approval["id"], "always")
    [rule] = await client.sessions.permissions(session["id"])
    assert (rule["tool"], rule["target"]) == ("shell", "make test")
    assert server.store.rule_matches(session["id"], "shell", "make test")
    await client.sessions.revoke(session["id"], rule["id"])
    assert await client.sessions.permissions(session["id"]) == []
    with pytest.raises(NotFoundError):
        await client.sessions.revoke(session["id"], rule["id"])
    with pytest.raises(NotFoundError):
        await client.sessions.revoke(session["id"], "rule/../x")


async def test_permission_mode_and_usage_of_a_session(server, client, bundle):
    created = await client.create_session(bundle, permission_mode="deny")
    assert created["permission_mode"] == "deny"
    assert created["usage"] == {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "turns": 0}
    typed = await client.sessions.get(created["id"])
    assert (typed.permission_mode, typed.usage["turns"]) == ("deny", 0)
    assert (await client.sessions.update(created["id"], permission_mode="ask")).permission_mode == "ask"
    assert (await client.sessions.update(created["id"], permission_mode=None)).permission_mode is None
    with pytest.raises(InvalidInputError):
        await client.sessions.update(created["id"], permission_mode="yolo")
    with pytest.raises(InvalidInputError):
        await client.create_session(bundle, permission_mode="always")
    listed = await client.sessions.list()
    assert {row.id: row.permission_mode for row in listed}[created["id"]] is None

    # usage as the loop stores it, per step
    store = server.store
    _, turn = store.queue_message(created["id"], {"type": "message", "role": "user", "content": "hi"})
    store.begin_step(created["id"], turn["id"], 0, "model")
    store.finish_model_step(created["id"], turn["id"], 0, [], None,
                            {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10})
    assert (await client.get_session(created["id"]))["usage"] == {"input_tokens": 7, "output_tokens": 3,
                                                                  "total_tokens": 10, "turns": 1}
    [row] = await client.list_turns(created["id"])
    assert row["usage"]["total_tokens"] == 10
    assert (row["step"]["kind"], row["step"]["status"]) == ("model", "completed")


async def test_a_message_carries_its_approval_timeout(server, client, session):
    sid = session["id"]
    timeouts = {}
    for given in (NOT_GIVEN, None, 0, 2.5):
        posted = await client.sessions.send_message(sid, "hi", approval_timeout=given)
        timeouts[repr(given)] = server.store.get_turn(posted["turn_id"])["approval_timeout"]
    assert timeouts == {"NOT_GIVEN": 600.0, "None": None, "0": 0.0, "2.5": 2.5}
    for bad in (-1, "soon", True, [], {}):
        with pytest.raises(InvalidInputError):
            await client.sessions.send_message(sid, "hi", approval_timeout=bad)  # type: ignore[arg-type]


async def test_retry_requeues_an_interrupted_turn_with_steps(server, client, session):
    sid, store = session["id"], server.store
    _, turn = store.queue_message(sid, {"type": "message", "role": "user", "content": "run it"})
    store.start_turn(turn["id"], "runner_gone")
    store.begin_step(sid, turn["id"], 0, "model", attempt=1)
    store.finish_model_step(sid, turn["id"], 0, [{"type": "function_call", "call_id": "c1", "name": "shell",
                                                  "arguments": "{}"}], None, None)
    store.begin_step(sid, turn["id"], 1, "tool", call_id="c1", tool="shell", attempt=1)
    store.mark_interrupted(turn["id"])
    [row] = await client.list_turns(sid)
    assert (row["status"], row["step"]["step"], row["step"]["tool"]) == ("interrupted", 1, "shell")

    retried = await client.retry(sid)
    assert (retried["turn_id"], retried["resumed"]) == (turn["id"], True)
    turns = store.list_turns(sid)
    assert [t["id"] for t in turns] == [turn["id"]]  # the same turn, no new one
    assert len(store.steps(turn["id"])) == 2


async def test_retry_without_steps_is_as_before(server, client, session):
    sid, store = session["id"], server.store
    _, turn = store.queue_message(sid, {"type": "message", "role": "user", "content": "q"})
    store.mark_interrupted(turn["id"])
    retried = await client.retry(sid)
    assert retried["turn_id"] != turn["id"] and "resumed" not in retried
    store.finish_turn(retried["turn_id"], "cancelled")  # Ctrl-C while it was queued: /retry runs it afresh
    again = await client.retry(sid)
    assert again["turn_id"] not in (turn["id"], retried["turn_id"]) and "resumed" not in again
    store.finish_turn(again["turn_id"], "completed")
    with pytest.raises(ConflictError):  # the newest turn completed: nothing to retry
        await client.retry(sid)
