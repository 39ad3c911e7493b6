"""Self-healing, deterministically: crashes, crash loops, hangs, duplicates, respawns.

The real server pieces (store, hub, registry, turn service, `serve_runner`)
and the real `Host` with its supervisor run in one nursery on an autojump
MockClock; only the runner processes are fakes (tests/support/fake_runners.py)
speaking the runner protocol over memory channels. Every test asserts the
exact sequence of session events with the virtual time each was seen.

Common timeline: restart delays are 0.5, 1, 2 ... s (TEST_POLICY), pings go
out every 1 s and a runner silent for more than 3 s is hung, and a fake
runner answers 1 s after the turn starts unless scripted otherwise.
"""

from __future__ import annotations

import signal
from typing import Any

import trio

from protocol import events as ev
from tests.support.fake_runners import (
    SIGKILL,
    RunnerScript,
    Seen,
    TurnScript,
    answers,
    collect_until_terminal,
    dies_mid_turn,
    fails_to_start,
    hangs_mid_turn,
    open_harness,
)

TIMEOUT = 60  # virtual seconds: every test ends far sooner


def brief(event: dict[str, Any]) -> tuple:
    """The fields of an event a test asserts on."""
    t = event["type"]
    if t == ev.SESSION_STATUS:
        return (t, event["status"])
    if t == ev.RESPONSE_CREATED:
        return (t, event["attempt"], event["runner_id"])
    if t == ev.TEXT_DELTA:
        return (t, event["delta"])
    if t == ev.RUNNER_LOST:
        return (t, event["runner_id"], event["cause"])
    if t == ev.RUNNER_REBOUND:
        return (t, event["old_runner_id"], event["new_runner_id"], event["cause"], event["downtime"],
                event["retrying"])
    if t == ev.COMPLETED:
        return (t, [part["text"] for item in event["response"]["output"] for part in item["content"]])
    if t == ev.FAILED:
        return (t, event["error"]["code"])
    return (t,)


# the turn-state events (interrupted, retried) are asserted in test_events_turn_state.py, the
# loop's (step recovered, usage) in test_agent_loop_*.py
_NOT_IN_TIMELINE = frozenset({ev.TURN_INTERRUPTED, ev.TURN_RETRIED, ev.STEP_RECOVERED, ev.USAGE})


def timeline(seen: list[Seen]) -> list[tuple]:
    return [(s.time, *brief(s.event)) for s in seen if s.event["type"] not in _NOT_IN_TIMELINE]


def texts(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(item["role"], item["content"][0]["text"]) for item in items]


def sup_timeline(events, child: str = "runner-0") -> list[tuple]:
    out = []
    for e in events:
        if e.child != child:
            continue
        if e.kind == "exited":
            out.append((e.time, e.kind, e.code, e.signal, e.reason))
        elif e.kind == "restarting":
            out.append((e.time, e.kind, e.delay))
        elif e.kind == "gave_up":
            out.append((e.time, e.kind, e.reason))
        else:
            out.append((e.time, e.kind))
    return out


# --- 1. a crash mid-turn ---------------------------------------------------------------


async def test_crash_mid_turn_retries_on_the_replacement_and_stores_one_answer(autojump_clock, tmp_path):
    scripts = [dies_mid_turn(after=1.0, returncode=-SIGKILL, partial="Hel"), answers("Hello!", after=1.0)]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, scripts) as h:
            (first,) = await h.online(1)
            assert trio.current_time() == 0
            sid = h.new_session()
            turn = h.post(sid, "hi")
            await h.until_terminal(sid, turn["id"])
            await h.settle()
            second = h.processes[1].runner_id
            assert first == h.processes[0].runner_id and second != first

            assert timeline(h.watches[sid].seen) == [
                (0, ev.INPUT_CONSUMED),
                (0, ev.SESSION_STATUS, "running"),
                (0, ev.RESPONSE_CREATED, 1, first),
                (0, ev.TEXT_DELTA, "Hel"),  # streamed by the attempt that dies: never stored
                (1, ev.RUNNER_LOST, first, "killed by SIGKILL"),
                (1.5, ev.RUNNER_REBOUND, first, second, "killed by SIGKILL", 0.5, True),
                (1.5, ev.SESSION_STATUS, "running"),
                (1.5, ev.RESPONSE_CREATED, 2, second),
                (2.5, ev.TEXT_DELTA, "Hello!"),
                (2.5, ev.COMPLETED, ["Hello!"]),
                (2.5, ev.SESSION_STATUS, "idle"),
            ]
            # the answer is stored once; the turn finished on its second attempt, on the replacement
            assert texts(h.store.list_items(sid)) == [("user", "hi"), ("assistant", "Hello!")]
            row = h.store.get_turn(turn["id"])
            assert (row["status"], row["attempt"], row["runner_id"]) == ("completed", 2, second)
            assert h.store.get_conversation(sid)["runner_id"] == second
            # the replacement got the same turn, attempt 2, with the whole history
            (received_at, start), = h.processes[1].turns_received
            assert (received_at, start.turn_id, start.attempt) == (1.5, turn["id"], 2)
            assert [item["role"] for item in start.input] == ["user"]
            # the supervisor replaced it after exactly the first backoff delay
            assert sup_timeline(h.supervisor_events) == [
                (0, "starting"), (0, "running"),
                (1, "exited", None, 9, "killed by SIGKILL"), (1, "restarting", 0.5),
                (1.5, "starting"), (1.5, "running"),
            ]
            assert h.processes[1].launched_at == 1.5
            gone = h.registry.departed[first]
            assert (gone.cause, gone.at) == ("killed by SIGKILL", 1)
            assert list(h.registry.online) == [second]


# --- 2. a crash loop --------------------------------------------------------------------


async def test_crash_loop_gives_up_with_the_reason_and_messages_fail_fast(autojump_clock, tmp_path):
    def script(n: int) -> RunnerScript:
        return fails_to_start(3, f"boom #{n}: cannot load harness 'fake'", after=0.25)

    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, script) as h:
            sid = h.new_session()
            waiting = h.post(sid, "anyone there?")  # no runner yet: waits for one
            await h.until_terminal(sid, waiting["id"])
            assert trio.current_time() == 4.5  # failed the moment the host gave up
            await h.settle()

            # starts at 0, 0.75, 2, 4.25, each dying 0.25 s later; the 4th exit within 10 s gives up
            reason = "exited with code 3 before it was ready"
            assert sup_timeline(h.supervisor_events) == [
                (0, "starting"), (0.25, "exited", 3, None, reason), (0.25, "restarting", 0.5),
                (0.75, "starting"), (1.0, "exited", 3, None, reason), (1.0, "restarting", 1),
                (2.0, "starting"), (2.25, "exited", 3, None, reason), (2.25, "restarting", 2),
                (4.25, "starting"), (4.5, "exited", 3, None, reason),
                (4.5, "gave_up", reason),
            ]
            assert [proc.launched_at for proc in h.processes] == [0, 0.75, 2.0, 4.25]
            assert len({proc.runner_id for proc in h.processes}) == 4  # a fresh id per start

            # the server knows why, with the last runner's log tail
            last = h.processes[-1]
            tail = f"fake runner #3 {last.runner_id} starting\nboom #3: cannot load harness 'fake'"
            assert h.registry.gave_up == f"{reason}\n{tail}"
            assert h.registry.departed[last.runner_id].cause == "exited with code 3"
            assert h.registry.pids[last.runner_id] == last.pid
            assert not h.registry.online

            expected_message = f"runners cannot stay up: {reason}\n{tail}"
            (gave_up,) = [s for s in h.watches[sid].seen if s.type == ev.RUNNERS_GAVE_UP]
            assert gave_up.event["reason"] == f"{reason}\n{tail}"
            (failed,) = [s for s in h.watches[sid].seen if s.type == ev.FAILED]
            assert failed.event["error"] == {"code": "runner_unavailable", "message": expected_message}
            assert timeline(h.watches[sid].seen) == [
                (0, ev.INPUT_CONSUMED),
                (4.5, ev.RUNNERS_GAVE_UP),  # told at once, with the reason, to whoever watches
                (4.5, ev.FAILED, "runner_unavailable"),
                (4.5, ev.SESSION_STATUS, "failed"),
            ]

            # a message after the give-up fails at once, with the same reason
            await trio.sleep(5.5)
            later = h.post(sid, "still there?")
            seen = await collect_until_terminal(h.hub, sid, later["id"], after=len(h.watches[sid].seen))
            assert timeline(seen) == [(10, ev.INPUT_CONSUMED), (10, ev.FAILED, "runner_unavailable")]
            assert seen[-1].event["error"]["message"] == expected_message

            # the user messages stay stored; both turns failed without an attempt
            assert texts(h.store.list_items(sid)) == [("user", "anyone there?"), ("user", "still there?")]
            rows = h.store.list_turns(sid)
            assert [(r["status"], r["attempt"], r["error"]) for r in rows] == [
                ("failed", 0, expected_message), ("failed", 0, expected_message)]


# --- 3. a hang -------------------------------------------------------------------------


async def test_hung_runner_is_killed_replaced_and_the_turn_retried(autojump_clock, tmp_path):
    scripts = [hangs_mid_turn(after=0.0), answers("Awake!", after=1.0)]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, scripts, ping_interval=1, ping_allowance=3) as h:
            (first,) = await h.online(1)
            await trio.sleep(2.5)  # pongs to the pings at 1 and 2
            sid = h.new_session()
            turn = h.post(sid, "are you there?")
            await h.until_terminal(sid, turn["id"])
            await h.settle()
            second = h.processes[1].runner_id

            # last pong at 2; pings at 3, 4, 5 unanswered; at 6 it was silent 4 s > 3 s: hung
            hung = "hung: no answer to pings for 4.0 s"
            cause = f"{hung}; killed by SIGKILL"
            assert timeline(h.watches[sid].seen) == [
                (2.5, ev.INPUT_CONSUMED),
                (2.5, ev.SESSION_STATUS, "running"),
                (2.5, ev.RESPONSE_CREATED, 1, first),
                (6, ev.RUNNER_LOST, first, cause),
                (6.5, ev.RUNNER_REBOUND, first, second, cause, 0.5, True),
                (6.5, ev.SESSION_STATUS, "running"),
                (6.5, ev.RESPONSE_CREATED, 2, second),
                (7.5, ev.TEXT_DELTA, "Awake!"),
                (7.5, ev.COMPLETED, ["Awake!"]),
                (7.5, ev.SESSION_STATUS, "idle"),
            ]
            # the server asked the host to kill it, the supervisor SIGKILLed its group at once
            hung_process = h.processes[0]
            assert hung_process.signals[0] == (6, SIGKILL)
            assert (hung_process.returncode, hung_process.exited_at) == (-SIGKILL, 6)
            assert hung_process.server_outcome == "returned"  # the server ended the connection itself
            assert sup_timeline(h.supervisor_events) == [
                (0, "starting"), (0, "running"),
                (6, "exited", None, 9, hung), (6, "restarting", 0.5),
                (6.5, "starting"), (6.5, "running"),
            ]
            assert h.registry.departed[first].cause == cause
            assert texts(h.store.list_items(sid)) == [("user", "are you there?"), ("assistant", "Awake!")]
            row = h.store.get_turn(turn["id"])
            assert (row["status"], row["attempt"], row["runner_id"]) == ("completed", 2, second)


# --- 4. duplicate and late completions ---------------------------------------------------


async def test_duplicate_completion_is_ignored(autojump_clock, tmp_path):
    twice = RunnerScript(turns=(TurnScript("duplicate", after=1.0, text="Hello!", duplicate_text="Hello twice"),),
                         default_turn=TurnScript("answer", after=1.0, text="Second answer"))
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [twice]) as h:
            (runner,) = await h.online(1)
            sid = h.new_session()
            turn = h.post(sid, "hi")
            await h.until_terminal(sid, turn["id"])
            await h.settle()
            process = h.processes[0]
            completions = [(t, f.response_id) for t, f in process.sent if f.kind == "turn.completed"]
            assert completions == [(1, f"resp_1000_{turn['id'][-6:]}"), (1, "resp_1000_dup")]

            # the session goes on, on the same runner: the stray frame reached nobody
            again = h.post(sid, "and again")
            await h.until_terminal(sid, again["id"])
            await h.settle()
            assert timeline(h.watches[sid].seen) == [
                (0, ev.INPUT_CONSUMED),
                (0, ev.SESSION_STATUS, "running"),
                (0, ev.RESPONSE_CREATED, 1, runner),
                (1, ev.TEXT_DELTA, "Hello!"),
                (1, ev.COMPLETED, ["Hello!"]),
                (1, ev.SESSION_STATUS, "idle"),
                (1, ev.INPUT_CONSUMED),
                (1, ev.SESSION_STATUS, "running"),
                (1, ev.RESPONSE_CREATED, 1, runner),
                (2, ev.TEXT_DELTA, "Second answer"),
                (2, ev.COMPLETED, ["Second answer"]),
                (2, ev.SESSION_STATUS, "idle"),
            ]
            assert texts(h.store.list_items(sid)) == [
                ("user", "hi"), ("assistant", "Hello!"), ("user", "and again"), ("assistant", "Second answer")]
            assert [(r["status"], r["attempt"]) for r in h.store.list_turns(sid)] == [
                ("completed", 1), ("completed", 1)]
            assert list(h.registry.online) == [runner] and process.alive
            assert process.server_outcome is None  # no protocol error: still connected
            assert len(h.processes) == 1


async def test_late_completion_from_a_dead_attempt_is_ignored(autojump_clock, tmp_path):
    """The process exits (the host reports it) but its socket lingers and sends a late answer."""
    zombie = RunnerScript(turns=(TurnScript("exit_linger", after=1.0, returncode=1, partial="Lat",
                                            linger=1.25, text="Late answer"),))
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [zombie, answers("Fresh answer", after=1.0)]) as h:
            (first,) = await h.online(1)
            sid = h.new_session()
            turn = h.post(sid, "hi")
            await h.until_terminal(sid, turn["id"])
            await trio.sleep(2)  # past the late completion (2.25) and a few ping ticks
            await h.settle()
            second = h.processes[1].runner_id
            assert timeline(h.watches[sid].seen) == [
                (0, ev.INPUT_CONSUMED),
                (0, ev.SESSION_STATUS, "running"),
                (0, ev.RESPONSE_CREATED, 1, first),
                (0, ev.TEXT_DELTA, "Lat"),
                (1, ev.RUNNER_LOST, first, "exited with code 1"),
                (1.5, ev.RUNNER_REBOUND, first, second, "exited with code 1", 0.5, True),
                (1.5, ev.SESSION_STATUS, "running"),
                (1.5, ev.RESPONSE_CREATED, 2, second),
                (2.5, ev.TEXT_DELTA, "Fresh answer"),
                (2.5, ev.COMPLETED, ["Fresh answer"]),
                (2.5, ev.SESSION_STATUS, "idle"),
            ]
            zombie_process = h.processes[0]
            # the server dropped the dead runner's connection when the host reported the exit
            assert zombie_process.server_outcome == "returned"
            assert zombie_process.late_delivered is False
            assert texts(h.store.list_items(sid)) == [("user", "hi"), ("assistant", "Fresh answer")]
            row = h.store.get_turn(turn["id"])
            assert (row["status"], row["attempt"], row["runner_id"]) == ("completed", 2, second)


# --- 5. a message while the only runner respawns -------------------------------------------


async def test_message_during_respawn_waits_and_runs_on_the_replacement(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, default=answers("Back!", after=1.0)) as h:
            (first,) = await h.online(1)
            sid = h.new_session()
            await trio.sleep(1)
            h.processes[0].kill(signal.SIGKILL)  # the idle runner dies: kill -9 from outside
            await h.until(lambda: not h.registry.online)
            assert trio.current_time() == 1
            turn = h.post(sid, "hello?")  # no runner online: the message waits for one
            await h.until_terminal(sid, turn["id"])
            await h.settle()
            second = h.processes[1].runner_id
            assert timeline(h.watches[sid].seen) == [
                (1, ev.INPUT_CONSUMED),
                (1.5, ev.SESSION_STATUS, "running"),
                (1.5, ev.RESPONSE_CREATED, 1, second),
                (2.5, ev.TEXT_DELTA, "Back!"),
                (2.5, ev.COMPLETED, ["Back!"]),
                (2.5, ev.SESSION_STATUS, "idle"),
            ]
            assert h.processes[1].launched_at == 1.5
            assert texts(h.store.list_items(sid)) == [("user", "hello?"), ("assistant", "Back!")]
            row = h.store.get_turn(turn["id"])
            assert (row["status"], row["attempt"], row["runner_id"]) == ("completed", 1, second)
            assert h.store.get_conversation(sid)["runner_id"] == second
            assert h.registry.departed[first].cause == "killed by SIGKILL"


async def test_message_racing_the_kill_still_gets_one_answer(autojump_clock, tmp_path):
    """Posted in the same instant as the kill, before the server noticed: the message may
    be sent to the dying runner first (then it is retried) or wait; either way one answer."""
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, default=answers("Back!", after=1.0)) as h:
            await h.online(1)
            sid = h.new_session()
            await trio.sleep(1)
            h.processes[0].kill(signal.SIGKILL)
            turn = h.post(sid, "hello?")  # no checkpoint in between
            await h.until_terminal(sid, turn["id"])
            assert trio.current_time() == 2.5
            second = h.processes[1].runner_id
            await h.settle()
            ends = [(s.time, s.type) for s in h.watches[sid].seen if s.type in (ev.COMPLETED, ev.FAILED)]
            assert ends == [(2.5, ev.COMPLETED)]
            assert texts(h.store.list_items(sid)) == [("user", "hello?"), ("assistant", "Back!")]
            row = h.store.get_turn(turn["id"])
            assert (row["status"], row["runner_id"]) == ("completed", second)


# --- 6. a warm spare ----------------------------------------------------------------------


async def test_warm_spare_takes_over_at_once_while_the_slot_refills(autojump_clock, tmp_path):
    scripts = [dies_mid_turn(after=1.0, partial="Hel"), answers("Spare here!", after=1.0)]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, scripts, runners=2, default=answers("Refill", after=1.0)) as h:
            first, spare = await h.online(2)
            assert (first, spare) == (h.processes[0].runner_id, h.processes[1].runner_id)
            sid = h.new_session()
            turn = h.post(sid, "hi")
            await h.until_terminal(sid, turn["id"])
            await h.settle()
            assert timeline(h.watches[sid].seen) == [
                (0, ev.INPUT_CONSUMED),
                (0, ev.SESSION_STATUS, "running"),
                (0, ev.RESPONSE_CREATED, 1, first),
                (0, ev.TEXT_DELTA, "Hel"),
                (1, ev.RUNNER_LOST, first, "killed by SIGKILL"),
                (1, ev.RUNNER_REBOUND, first, spare, "killed by SIGKILL", 0.0, True),
                (1, ev.SESSION_STATUS, "running"),
                (1, ev.RESPONSE_CREATED, 2, spare),
                (2, ev.TEXT_DELTA, "Spare here!"),
                (2, ev.COMPLETED, ["Spare here!"]),
                (2, ev.SESSION_STATUS, "idle"),
            ]
            # meanwhile the supervisor refilled the dead slot after its backoff
            refill = h.processes[2]
            assert refill.launched_at == 1.5
            assert sorted(h.registry.online) == sorted([spare, refill.runner_id])
            assert sup_timeline(h.supervisor_events, "runner-0") == [
                (0, "starting"), (0, "running"),
                (1, "exited", None, 9, "killed by SIGKILL"), (1, "restarting", 0.5),
                (1.5, "starting"), (1.5, "running"),
            ]
            assert sup_timeline(h.supervisor_events, "runner-1") == [(0, "starting"), (0, "running")]
            assert texts(h.store.list_items(sid)) == [("user", "hi"), ("assistant", "Spare here!")]
            row = h.store.get_turn(turn["id"])
            assert (row["status"], row["attempt"], row["runner_id"]) == ("completed", 2, spare)
            assert h.store.get_conversation(sid)["runner_id"] == spare


# --- 7. the limits: a crash loop after a crash, and too many losses -------------------------


async def test_crash_mid_turn_then_crash_loop_fails_the_turn_with_the_reason(autojump_clock, tmp_path):
    def script(n: int) -> RunnerScript:
        if n == 0:
            return dies_mid_turn(after=1.0)
        return fails_to_start(3, f"boom #{n}", after=0.25)

    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, script) as h:
            (first,) = await h.online(1)
            sid = h.new_session()
            turn = h.post(sid, "hi")
            await h.until_terminal(sid, turn["id"])
            await h.settle()
            # exits at 1 (the crash), then 1.75, 3.0 and 5.25 (restarts after 0.5, 1 and 2 s): gave up
            reason = "exited with code 3 before it was ready"
            assert [(e.time, e.kind) for e in h.sup("starting", "gave_up")] == [
                (0, "starting"), (1.5, "starting"), (2.75, "starting"), (5.0, "starting"), (5.25, "gave_up")]
            assert timeline(h.watches[sid].seen) == [
                (0, ev.INPUT_CONSUMED),
                (0, ev.SESSION_STATUS, "running"),
                (0, ev.RESPONSE_CREATED, 1, first),
                (1, ev.RUNNER_LOST, first, "killed by SIGKILL"),
                (5.25, ev.RUNNERS_GAVE_UP),
                (5.25, ev.FAILED, "runner_unavailable"),
                (5.25, ev.SESSION_STATUS, "failed"),
            ]
            message = h.watches[sid].seen[-2].event["error"]["message"]
            assert message.startswith(f"runners cannot stay up: {reason}\n") and message.endswith("boom #3")
            row = h.store.get_turn(turn["id"])
            assert (row["status"], row["attempt"], row["error"]) == ("failed", 1, message)
            assert texts(h.store.list_items(sid)) == [("user", "hi")]


async def test_lost_on_every_attempt_fails_with_runner_lost_then_the_session_goes_on(autojump_clock, tmp_path):
    scripts = [dies_mid_turn(after=1.0), dies_mid_turn(after=1.0), answers("Finally", after=1.0)]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, scripts, max_attempts=2) as h:
            (first,) = await h.online(1)
            sid = h.new_session()
            turn = h.post(sid, "hi")
            await h.until_terminal(sid, turn["id"])
            await h.settle()
            second = h.processes[1].runner_id
            assert timeline(h.watches[sid].seen) == [
                (0, ev.INPUT_CONSUMED),
                (0, ev.SESSION_STATUS, "running"),
                (0, ev.RESPONSE_CREATED, 1, first),
                (1, ev.RUNNER_LOST, first, "killed by SIGKILL"),
                (1.5, ev.RUNNER_REBOUND, first, second, "killed by SIGKILL", 0.5, True),
                (1.5, ev.SESSION_STATUS, "running"),
                (1.5, ev.RESPONSE_CREATED, 2, second),
                (2.5, ev.FAILED, "runner_lost"),
                (2.5, ev.SESSION_STATUS, "failed"),
                (2.5, ev.RUNNER_LOST, second, "killed by SIGKILL"),
            ]
            row = h.store.get_turn(turn["id"])
            assert (row["status"], row["attempt"]) == ("failed", 2)
            assert row["error"] == ("the runner was lost 2 times while running this turn; "
                                "it is not dispatched again (OMNIGENT_TURN_LOSSES=2)")

            # the third runner (after the second backoff, 1 s) adopts the session; the next message runs
            third = (await h.online(1))[0]
            assert trio.current_time() == 3.5 and third == h.processes[2].runner_id
            again = h.post(sid, "once more")
            await h.until_terminal(sid, again["id"])
            await h.settle()
            assert timeline(h.watches[sid].seen)[10:] == [
                (3.5, ev.RUNNER_REBOUND, second, third, "killed by SIGKILL", 1.0, False),
                (3.5, ev.INPUT_CONSUMED),
                (3.5, ev.SESSION_STATUS, "running"),
                (3.5, ev.RESPONSE_CREATED, 1, third),
                (4.5, ev.TEXT_DELTA, "Finally"),
                (4.5, ev.COMPLETED, ["Finally"]),
                (4.5, ev.SESSION_STATUS, "idle"),
            ]
            assert texts(h.store.list_items(sid)) == [("user", "hi"), ("user", "once more"), ("assistant", "Finally")]
