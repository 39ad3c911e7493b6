"""A message to an idle session starts its turn's attempt in the message's own transaction.

`TurnService.queue_message` (what the route does, in one transaction) starts the
first attempt with the message when the worker would start it at once: the claim was
taken with the message (no turn of the session queued, running or claimed), its runner
is bound and online (or, for a session bound to none, one may be bound at once:
`Placement.at_once`), and no turn of it runs in this service (its worker, if any, is
leaving its last turn). Otherwise the turn is queued and the worker places it as before.
MockClock, fake runners, events stored as a server stores them.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
import trio

import protocol as p
from omnigent.server.app import create_app
from protocol import events as ev
from tests.support.fake_runners import Harness, answers, open_harness

TIMEOUT = 60  # virtual seconds
USER = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "again"}]}
HEADERS = {"Authorization": "Bearer t", "Origin": "omnigent://internal"}  # the harness's server token


async def _bound_session(h: Harness) -> str:
    """A new session whose first turn (the one that binds it to its runner) is answered, and its
    worker gone."""
    sid = h.new_session()
    await h.until_terminal(sid, h.post(sid, "hi")["id"])
    await h.settle()
    return sid


def _queue(h: Harness, sid: str) -> tuple[dict[str, Any], list[str]]:
    """What the route does with a message: the turn it returns and the statements it took."""
    statements: list[str] = []
    h.store.conn.set_trace_callback(statements.append)
    try:
        _item, turn = h.turns.queue_message(sid, USER)
    finally:
        h.store.conn.set_trace_callback(None)
    return turn, statements


async def test_an_idle_sessions_message_starts_the_attempt_in_its_transaction(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [answers("one", after=0.5)], stored_events=True) as h:
            (runner_id,) = await h.online(1)
            sid = h.new_session()
            first = h.post(sid, "hi")  # no runner bound yet: one is bound, and the attempt starts, with it
            assert first["status"] == "running" and h.store.get_conversation(sid)["runner_id"] == runner_id
            await h.until_terminal(sid, first["id"])
            await h.settle()
            before = h.store.last_event_seq(sid)
            turn, statements = _queue(h, sid)
            assert [s for s in statements if s.startswith(("BEGIN", "COMMIT"))] == ["BEGIN IMMEDIATE", "COMMIT"]
            row = h.store.get_turn(turn["id"])
            assert (row["status"], row["attempt"], row["runner_id"]) == ("running", 1, runner_id)
            assert row["step"]["status"] == "running"  # its model step 0 with it
            assert turn["status"] == "running"
            assert [e["type"] for e in h.store.read_events(sid, before)] == [
                ev.INPUT_CONSUMED, ev.SESSION_STATUS, ev.RESPONSE_CREATED]
            assert h.turns.status(sid) == "running"  # before its worker has run
            h.turns.submit(sid)
            seen = await h.until_terminal(sid, turn["id"])
            assert ev.COMPLETED in [s.type for s in seen] and ev.FAILED not in [s.type for s in seen]
            await h.settle()
            assert h.store.get_turn(turn["id"])["attempt"] == 1  # started once, not again by the worker
            assert h.model_steps() == [(0, 0, 1), (0, 0, 1)]  # one TurnStart each
            assert h.store.claim_of(sid) is None
            assert h.turns.status(sid) == "idle"


def _post_after_first_turn(h: Harness, sid: str, *, then_raise: bool = False) -> list[dict[str, Any]]:
    """Post the next message right after the worker's first turn ends, while that worker is still
    inside the turn's `Claims.renewed` (as a client that posts on seeing the answer does, while the
    worker leaves the turn); `then_raise`: the worker's turn then raises, so `renewed` exits unclean.
    Returns the posted turn (once posted) with the statements its post took."""
    run_turn = h.turns._run_turn
    posted: list[dict[str, Any]] = []

    async def then_post(*args: Any, **kwargs: Any) -> None:
        await run_turn(*args, **kwargs)
        if posted:
            return
        turn, statements = _queue(h, sid)
        posted.append({"turn": turn, "statements": statements, "serving": sid in h.turns._serving,
                       "held": h.hub._log(sid).hold is not None})
        h.turns.submit(sid)
        if then_raise:
            raise RuntimeError("the worker broke after its turn")

    h.turns._run_turn = then_post  # type: ignore[method-assign]
    return posted


async def test_a_message_posted_while_the_worker_leaves_its_turn_starts_with_it(autojump_clock, tmp_path):
    """The last turn released the claim with its end, so the claim comes with the next message even
    though that turn's worker has not left it yet: the attempt starts in the message's transaction,
    and the same worker follows it next, once."""
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [answers("one", after=0.5)], stored_events=True) as h:
            (runner_id,) = await h.online(1)
            sid = await _bound_session(h)
            posted = _post_after_first_turn(h, sid)
            await h.until_terminal(sid, h.post(sid, "more")["id"])
            (second,) = posted
            assert second["serving"]  # the worker of the turn before was still there
            assert second["held"]  # its watchers (and its post's answer) wait for the TurnStart
            assert [s for s in second["statements"] if s.startswith(("BEGIN", "COMMIT"))] == [
                "BEGIN IMMEDIATE", "COMMIT"]
            turn = second["turn"]
            assert (turn["status"], turn["attempt"], turn["runner_id"]) == ("running", 1, runner_id)
            seen = await h.until_terminal(sid, turn["id"])
            types = [s.type for s in seen if s.event.get("turn_id") == turn["id"]]
            assert types.count(ev.COMPLETED) == 1 and ev.FAILED not in types, types
            await h.settle()
            assert h.store.get_turn(turn["id"])["attempt"] == 1  # started once, not again by the worker
            assert h.model_steps() == [(0, 0, 1)] * 3  # one TurnStart each
            assert h.store.claim_of(sid) is None
            assert h.turns.status(sid) == "idle"


async def test_a_worker_that_breaks_leaving_its_turn_still_runs_the_started_one_once(autojump_clock, tmp_path):
    """The worker fails after its turn ended and the next message started its attempt: leaving
    `Claims.renewed` unclean, it releases only its own turn's claim, not the new turn's. The worker
    then follows the started attempt, which holds its claim throughout: answered once, the turn
    before left as it was."""
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [answers("one", after=0.5)], stored_events=True) as h:
            await h.online(1)
            sid = await _bound_session(h)
            posted = _post_after_first_turn(h, sid, then_raise=True)
            before = h.post(sid, "more")
            await h.until_terminal(sid, before["id"])
            (second,) = posted
            turn = second["turn"]
            assert turn["status"] == "running"
            while not [e for e in h.store.read_events(sid, 0) if e.get("turn_id") == turn["id"]
                       and e["type"] == ev.TEXT_DELTA]:
                assert h.store.claim_of(sid)["turn_id"] == turn["id"]  # held all along
                await trio.sleep(0.05)
            seen = await h.until_terminal(sid, turn["id"])
            types = [s.type for s in seen if s.event.get("turn_id") == turn["id"]]
            assert types.count(ev.COMPLETED) == 1 and ev.FAILED not in types, types
            await h.settle()
            assert h.store.get_turn(before["id"])["status"] == "completed"  # its end stands
            assert h.store.get_turn(turn["id"])["attempt"] == 1
            assert h.model_steps() == [(0, 0, 1)] * 3
            assert h.store.claim_of(sid) is None
            assert h.turns.status(sid) == "idle"


async def test_a_message_behind_a_running_turn_waits_queued(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [answers("slow", after=5.0)], stored_events=True) as h:
            await h.online(1)
            sid = h.new_session()
            first = h.post(sid, "hi")
            await h.settle()
            assert h.store.get_turn(first["id"])["status"] == "running"
            second, statements = _queue(h, sid)
            assert second["status"] == "queued"  # pending behind the first: its worker takes it next
            assert not any("UPDATE turns SET status = 'running'" in s for s in statements)
            h.turns.submit(sid)
            await h.until_terminal(sid, first["id"])
            seen = await h.until_terminal(sid, second["id"])
            assert ev.COMPLETED in [s.type for s in seen] and ev.FAILED not in [s.type for s in seen]
            assert h.store.get_turn(second["id"])["attempt"] == 1


async def test_a_runner_lost_before_the_started_attempt_is_followed_is_a_lost_attempt(autojump_clock, tmp_path):
    """The attempt started with the message went to a runner that died before the worker ran:
    the worker finds it lost, the turn is interrupted and retried on the replacement, and
    answered once."""
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [answers("one", after=0.5), answers("two", after=0.5)],
                                stored_events=True) as h:
            (first_runner,) = await h.online(1)
            sid = await _bound_session(h)
            turn, _ = _queue(h, sid)
            assert h.store.get_turn(turn["id"])["runner_id"] == first_runner
            h.launcher.by_id(first_runner).kill()  # before the turn's worker runs
            h.turns.submit(sid)
            seen = await h.until_terminal(sid, turn["id"])
            assert ev.COMPLETED in [s.type for s in seen] and ev.FAILED not in [s.type for s in seen]
            types = [s.type for s in seen if s.event.get("turn_id") == turn["id"]]
            assert types.count(ev.TURN_RETRIED) == 1 and types.count(ev.COMPLETED) == 1, types
            row = h.store.get_turn(turn["id"])
            assert row["attempt"] == 2 and row["runner_id"] != first_runner
            assert [s for s in h.model_steps() if s[0] == 1] == [(1, 0, 2)]  # the replacement's one TurnStart


async def test_a_message_whose_transaction_fails_leaves_no_attempt_behind(autojump_clock, tmp_path):
    """The attempt is handed to the worker only once its transaction committed: a message whose
    transaction fails (a full disk, say) leaves no turn, and the next message runs as ever."""
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [answers("one", after=0.5)], stored_events=True) as h:
            await h.online(1)
            sid = await _bound_session(h)
            turns_before = h.store.list_turns(sid)
            append = h.store.append_events

            def failing(*args: Any, **kwargs: Any) -> list[str]:
                h.store.append_events = append  # type: ignore[method-assign]  # once
                raise sqlite3.OperationalError("database or disk is full")

            h.store.append_events = failing  # type: ignore[method-assign]
            with pytest.raises(sqlite3.OperationalError):
                h.turns.queue_message(sid, USER)
            assert h.store.list_turns(sid) == turns_before  # rolled back: no turn, no claim
            assert h.store.claim_of(sid) is None
            h.turns.submit(sid)  # (a worker started now finds nothing to run)
            await h.settle()
            assert h.turns.status(sid) == "idle"
            turn = h.post(sid, "again")
            assert turn["status"] == "running"
            seen = await h.until_terminal(sid, turn["id"])
            assert ev.COMPLETED in [s.type for s in seen if s.event.get("turn_id") == turn["id"]]
            assert len(h.model_steps()) == 2


async def test_the_posts_answer_goes_out_after_its_turn_start(autojump_clock, tmp_path):
    """`POST /v1/sessions/<id>/events` answers 202 once the turn's TurnStart is on the runner's link
    (`EventHub.dispatched`): its HTTP answer does not run between the dispatch's steps."""
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [answers("one", after=0.5)], stored_events=True) as h:
            await h.online(1)
            sid = await _bound_session(h)
            order: list[str] = []
            (process,) = h.processes
            send = process.transport.send

            async def recorded(text: str) -> None:
                await send(text)
                if isinstance(p.decode(text), p.TurnStart):
                    order.append("turn start written")

            process.transport.send = recorded  # type: ignore[method-assign]
            app = create_app(h.state)
            asgi = app.asgi_app

            async def answer_recorded(scope: Any, receive: Any, send: Any) -> None:
                async def sent(message: dict[str, Any]) -> None:
                    if message["type"] == "http.response.start":
                        order.append("answered")
                    await send(message)

                await asgi(scope, receive, sent)

            app.asgi_app = answer_recorded  # type: ignore[method-assign]
            body = {"type": "message", "data": USER}
            answer = await app.test_client().post(f"/v1/sessions/{sid}/events", json=body, headers=HEADERS)
            assert answer.status_code == 202, await answer.get_data()
            assert order == ["turn start written", "answered"]
            turn_id = (await answer.get_json())["turn_id"]
            seen = await h.until_terminal(sid, turn_id)
            assert ev.COMPLETED in [s.type for s in seen if s.event.get("turn_id") == turn_id]
