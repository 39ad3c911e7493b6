"""Recovery under load and one turn at a time per conversation (issue 7 §9, §10), deterministically.

Same pieces as test_recovery.py: the real server code, the real `Host` and
supervisor, fake runners (tests/support/fake_runners.py), an autojump MockClock.
Here: sessions spread over the runners, a turn that keeps losing runners, a
poison turn against the host's real restart intensity, and conversation claims
held by "another process" (a claim owner that is not this turn service).
"""

from __future__ import annotations

import os
from typing import Any

import trio

from omnigent.host.pool import DEFAULT_POLICY
from omnigent.store.owners import ClaimOwner
from protocol import events as ev
from tests.support.fake_runners import (
    RunnerScript,
    TurnScript,
    another_process,
    answers,
    assistant_item,
    dies_mid_turn,
    open_harness,
)

TIMEOUT = 300  # virtual seconds
# open_harness's `max_attempts` is TurnService's loss bound (OMNIGENT_TURN_LOSSES, default 5)


def texts(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    out = []
    for item in items:
        content = item["content"]
        out.append((item["role"], content if isinstance(content, str) else content[0]["text"]))
    return out


def queue(h, sid: str, text: str) -> dict[str, Any]:
    """What `POST /v1/sessions/<id>/events` does now: the message is stored, or pending while busy."""
    item, turn = h.store.queue_message(sid, {"type": "message", "role": "user",
                                             "content": [{"type": "input_text", "text": text}]})
    h.hub.publish(sid, ev.INPUT_CONSUMED, item=item, turn_id=turn["id"])
    h.turns.submit(sid)
    return turn


def events_of(h, sid: str, kind: str) -> list[dict[str, Any]]:
    return [s.event for s in h.watches[sid].seen if s.type == kind]


def bindings(h, sids: list[str]) -> list[str]:
    return [h.store.get_conversation(sid)["runner_id"] for sid in sids]


# --- spreading ------------------------------------------------------------------------------


async def test_sessions_spread_over_the_runners_and_a_lost_runners_sessions_spread_again(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, runners=3, default=answers("ok", after=1.0)) as h:
            runners = await h.online(3)
            sids = [h.new_session() for _ in range(6)]
            turns = [queue(h, sid, f"hi {i}") for i, sid in enumerate(sids)]
            for sid, turn in zip(sids, turns):
                await h.until_terminal(sid, turn["id"])
            bound = bindings(h, sids)
            assert sorted(bound.count(r) for r in runners) == [2, 2, 2]  # not all on the first

            victim = bound[0]
            moved = [sid for sid, r in zip(sids, bound) if r == victim]
            h.launcher.by_id(victim).kill()
            await h.until(lambda: victim not in h.registry.online)
            await h.settle()
            await trio.sleep(0.3)  # the exit report wait, then the rebinding
            survivors = [r for r in runners if r != victim]
            new = bindings(h, moved)
            assert sorted(new) == sorted(survivors)  # one each, not both onto one runner
            for sid, runner in zip(moved, new):
                (rebound,) = events_of(h, sid, ev.RUNNER_REBOUND)
                assert (rebound["old_runner_id"], rebound["new_runner_id"]) == (victim, runner)
            # and a new session goes to the least loaded runner: the victim's replacement
            await h.online(3)
            replacement = next(r for r in h.registry.online if r not in runners)
            sid = h.new_session()
            await h.until_terminal(sid, queue(h, sid, "new")["id"])
            assert bindings(h, [sid]) == [replacement]


# --- a turn that keeps losing runners -----------------------------------------------------------


async def test_a_second_kill_on_the_runner_that_took_over_is_retried_again(autojump_clock, tmp_path):
    scripts = [dies_mid_turn(after=1.0), dies_mid_turn(after=1.0), answers("third time", after=1.0)]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, scripts, max_attempts=5) as h:  # the default OMNIGENT_TURN_LOSSES
            await h.online(1)
            sid = h.new_session()
            turn = queue(h, sid, "hi")
            await h.until_terminal(sid, turn["id"])
            assert [e["attempt"] for e in events_of(h, sid, ev.RESPONSE_CREATED)] == [1, 2, 3]
            assert events_of(h, sid, ev.FAILED) == []
            assert texts(h.store.list_items(sid)) == [("user", "hi"), ("assistant", "third time")]
            assert h.store.get_turn(turn["id"])["status"] == "completed"


def _poison_scripts(n: int) -> RunnerScript:
    """#0 answers one turn, then dies on the poison; #1.. die on their first turn; #7 answers."""
    if n == 0:
        return RunnerScript(turns=(TurnScript("answer", after=1.0, text="before"),
                                   TurnScript("die", after=0.1)))
    if n < 7:
        return dies_mid_turn(after=0.1)
    return answers("after", after=1.0)


async def _poison_run(h, *, external_kill: bool) -> tuple[str, dict, list[float]]:
    await h.online(1)
    other = h.new_session()
    await h.until_terminal(other, queue(h, other, "first")["id"])
    poison_sid = h.new_session()
    poison = queue(h, poison_sid, "poison")
    if external_kill:  # one more kill of the slot meanwhile (a chaos kill, an OOM, a user's kill -9)
        await trio.sleep(10)
        alive = [proc for proc in h.processes if proc.alive]
        alive[-1].kill()
    with trio.move_on_after(200):
        await h.until_terminal(poison_sid, poison["id"])
    starts = [t for proc in h.processes for t, start in proc.turns_received if start.turn_id == poison["id"]]
    return poison_sid, poison, starts


async def test_a_poison_turn_fails_after_its_bound_and_the_host_keeps_serving(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, _poison_scripts, policy=DEFAULT_POLICY, max_attempts=5) as h:
            poison_sid, poison, starts = await _poison_run(h, external_kill=True)
            (failed,) = events_of(h, poison_sid, ev.FAILED)
            assert failed["error"]["code"] == "runner_lost"
            assert "lost 5 times" in failed["error"]["message"]
            # dispatched 5 times, never again; the first three at once, the rest paced
            assert len(starts) == 5
            assert starts[2] - starts[0] < 5 and starts[3] - starts[0] >= 30
            assert h.store.get_turn(poison["id"])["status"] == "failed"
            # the host never gave up, and the other session is served on
            assert h.registry.gave_up is None and not h.sup("gave_up")
            other = next(sid for sid in h.watches if sid != poison_sid)
            await h.until_terminal(other, queue(h, other, "second")["id"])
            assert texts(h.store.list_items(other))[-1] == ("assistant", "after")


async def test_without_pacing_the_same_poison_turn_would_exceed_the_restart_intensity(autojump_clock, tmp_path):
    """The collision the pacing prevents: 5 quick losses plus one more kill give the host up."""
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, _poison_scripts, policy=DEFAULT_POLICY, max_attempts=5) as h:
            h.turns.loss_budget = 99
            await _poison_run(h, external_kill=True)
            await h.until(lambda: h.registry.gave_up is not None)
            assert h.sup("gave_up")


# --- conversation claims ------------------------------------------------------------------------


async def test_a_turn_waits_behind_another_process_and_its_history_has_that_answer(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, default=answers("mine", after=1.0)) as h:
            await h.online(1)
            sid = h.new_session()
            other = another_process()
            # the other process's turn: its user message is stored, it holds the claim
            theirs = h.store.append_item(sid, {"type": "message", "role": "user", "content": "theirs"})
            assert h.store.claim_conversation(sid, other, turn_id=None, lease=60)
            turn = queue(h, sid, "mine?")
            await trio.sleep(20)
            assert events_of(h, sid, ev.RESPONSE_CREATED) == []        # it waits
            assert texts(h.store.list_items(sid)) == [("user", "theirs")]  # its message too
            # the other process answers and lets go
            h.store.append_item(sid, assistant_item("their answer") | {"id": None})
            assert h.store.release_claim(sid, other)
            await h.until_terminal(sid, turn["id"])
            assert texts(h.store.list_items(sid)) == [
                ("user", "theirs"), ("assistant", "their answer"), ("user", "mine?"), ("assistant", "mine")]
            (_, start), = h.processes[0].turns_received
            assert [i["role"] for i in start.input] == ["user", "assistant", "user"]
            assert [i["content"] for i in start.input[:2:2]] == [theirs["content"]]  # theirs first
            assert "their answer" in str(start.input[1]["content"])
            await h.settle()
            assert h.store.claim_of(sid) is None  # released after the turn


async def test_a_claim_of_a_dead_or_reused_pid_or_with_an_expired_lease_is_taken_over(autojump_clock, tmp_path):
    me = ClaimOwner.this_process()
    dead = [ClaimOwner(4_194_304 + 4321, "1", "gone"),        # no such pid
            ClaimOwner(me.pid, str(int(me.started) + 1), "reused"),  # our pid, another start time
            ClaimOwner(me.pid, me.started, "stuck")]          # alive, but its lease ran out
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, default=answers("ok", after=1.0)) as h:
            await h.online(1)
            for owner in dead:
                sid = h.new_session()
                h.store.claim_conversation(sid, owner, turn_id=None, lease=-1 if owner.token == "stuck" else 60)
                started = trio.current_time()
                await h.until_terminal(sid, queue(h, sid, "hi")["id"])
                assert trio.current_time() - started < 5
                assert texts(h.store.list_items(sid))[-1] == ("assistant", "ok")


async def test_a_lost_runner_leaves_a_session_claimed_by_another_live_process_alone(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, runners=2, default=answers("ok", after=1.0)) as h:
            await h.online(2)
            sids = [h.new_session() for _ in range(3)]
            for sid in sids:
                await h.until_terminal(sid, queue(h, sid, "hi")["id"])
            victim = h.store.get_conversation(sids[0])["runner_id"]
            on_victim = [sid for sid in sids if h.store.get_conversation(sid)["runner_id"] == victim]
            claimed, *free = on_victim
            assert h.store.claim_conversation(claimed, another_process(), turn_id=None, lease=60)
            h.launcher.by_id(victim).kill()
            await h.until(lambda: victim not in h.registry.online)
            await trio.sleep(0.3)
            assert h.store.get_conversation(claimed)["runner_id"] == victim  # not ours to move
            assert all(h.store.get_conversation(sid)["runner_id"] != victim for sid in free)
            # once the other process lets go, this server's next turn takes it over
            h.store.release_claim(claimed, another_process())
            await h.until_terminal(claimed, queue(h, claimed, "again")["id"])
            assert h.store.get_conversation(claimed)["runner_id"] in h.registry.online
            assert os.getpid() == ClaimOwner.this_process().pid


async def test_interrupt_ends_a_turn_waiting_behind_another_process_or_a_paced_retry(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, _poison_scripts, policy=DEFAULT_POLICY, max_attempts=5) as h:
            await h.online(1)
            # behind another process's claim
            sid = h.new_session()
            assert h.store.claim_conversation(sid, another_process(), turn_id=None, lease=60)
            waiting = queue(h, sid, "waiting")
            await trio.sleep(3)
            assert await h.turns.interrupt(sid)
            await h.until_terminal(sid, waiting["id"])
            assert [e["turn_id"] for e in events_of(h, sid, ev.CANCELLED)] == [waiting["id"]]
            assert h.store.get_turn(waiting["id"])["status"] == "cancelled"
            h.store.release_claim(sid, another_process())
            # a poison turn paused after three losses
            other = h.new_session()
            await h.until_terminal(other, queue(h, other, "first")["id"])
            poison_sid = h.new_session()
            poison = queue(h, poison_sid, "poison")
            await h.until(lambda: len([p for p in h.processes if not p.alive]) >= 3)
            await trio.sleep(5)
            assert h.turns.active_runner(poison_sid) is None  # paused, on no runner
            assert await h.turns.interrupt(poison_sid)
            await h.until_terminal(poison_sid, poison["id"])
            assert h.store.get_turn(poison["id"])["status"] == "cancelled"
            assert events_of(h, poison_sid, ev.FAILED) == []


async def test_a_turn_whose_claim_was_taken_over_while_it_stalled_never_answers(autojump_clock, tmp_path):
    """A holder that stalled past its lease lost the conversation to another process, whose turn
    read (and will answer) this turn's message: this turn ends as overtaken, storing no answer."""
    from omnigent.server.claims import LEASE

    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, default=answers("stale answer", after=30.0)) as h:
            await h.online(1)
            sid = h.new_session()
            turn = queue(h, sid, "mine")
            while not events_of(h, sid, ev.RESPONSE_CREATED):
                await trio.sleep(0.1)  # the model call is under way (virtual time)
            # as if this process had stalled: its lease ran out and another process took over
            h.store.conn.execute("UPDATE conversation_claims SET lease_until = 0 WHERE conversation_id = ?", [sid])
            h.store.conn.commit()
            assert h.store.claim_conversation(sid, another_process(), turn_id=None, lease=600)
            await trio.sleep(LEASE)
            [failed] = events_of(h, sid, ev.FAILED)
            assert failed["turn_id"] == turn["id"] and failed["error"]["code"] == "overtaken"
            await trio.sleep(60)  # the runner's late answer arrives to nobody
            assert [role for role, _ in texts(h.store.list_items(sid))] == ["user"]
            assert h.store.get_turn(turn["id"])["status"] == "failed"
            assert h.store.claim_of(sid)["owner_token"] == "another-process"  # not released by us
