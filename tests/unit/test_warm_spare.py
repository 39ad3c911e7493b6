"""The REPL's warm spare starts late: after the fixed runners are online and the gate opened.

Why: a spare that starts with the first runner imports openai while that
runner serves the first turn, and on 2 cores that delays the first answer.
The host adds the spare slot (`Supervisor.start_child`) only once
`release_spares()` was called *and* its fixed slots are online; from then on
it is a slot like any other, so a killed runner is replaced by it at once.
Real `Host` and server pieces, fake runner processes, autojump MockClock.
"""

from __future__ import annotations

import trio

from protocol import events as ev
from tests.support.fake_runners import RunnerScript, TurnScript, answers, open_harness

TIMEOUT = 60  # virtual seconds


def starts(h, slot: str) -> list[float]:
    return [e.time for e in h.sup("starting") if e.child == slot]


async def test_the_spare_waits_for_the_gate(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, default=answers("Hi", after=1.0), spares=1) as h:
            (first,) = await h.online(1)
            sid = h.new_session()
            turn = h.post(sid, "hi")
            await h.until_terminal(sid, turn["id"])
            await trio.sleep(30)  # however long: nothing opens the gate
            await h.settle()
            assert len(h.processes) == 1 and starts(h, "runner-1") == []
            assert list(h.registry.online) == [first]

            released = trio.current_time()
            h.host.release_spares()
            await h.online(2)
            assert starts(h, "runner-1") == [released]
            assert len(h.processes) == 2
            h.host.release_spares()  # idempotent
            await h.settle()
            assert len(h.processes) == 2


async def test_an_early_gate_still_waits_for_the_first_runner_online(autojump_clock, tmp_path):
    slow = RunnerScript(hello_after=2.0, default_turn=TurnScript("answer", after=1.0, text="Hi"))
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [slow], default=answers("Hi"), spares=1) as h:
            h.host.release_spares()  # e.g. the REPL reached a terminal prompt at once
            await h.online(1)
            assert trio.current_time() == 2.0
            await h.online(2)
            assert starts(h, "runner-0") == [0] and starts(h, "runner-1") == [2.0]


async def test_after_release_a_killed_runner_is_replaced_by_the_warm_spare(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, default=answers("Hi", after=1.0), spares=1) as h:
            (first,) = await h.online(1)
            sid = h.new_session()
            turn = h.post(sid, "hi")
            await h.until_terminal(sid, turn["id"])
            h.host.release_spares()
            await h.online(2)
            spare = h.processes[1].runner_id
            assert h.store.get_conversation(sid)["runner_id"] == first

            killed = trio.current_time()
            h.launcher.by_id(first).kill()
            await h.until(lambda: first not in h.registry.online)
            turn = h.post(sid, "again")
            seen = [s for s in await h.until_terminal(sid, turn["id"]) if s.event.get("turn_id") == turn["id"]]
            created = next(s for s in seen if s.event["type"] == ev.RESPONSE_CREATED)
            done = next(s for s in seen if s.event["type"] == ev.COMPLETED)
            # served by the spare straight away: no restart delay, no start-up wait
            assert created.event["runner_id"] == spare and created.time == killed
            assert done.time == killed + 1.0
            # and the killed slot is refilled by the policy (restart delay 0.5 s)
            await h.online(2)
            assert starts(h, "runner-0") == [0, killed + 0.5]


async def test_without_spares_nothing_more_starts(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, default=answers("Hi")) as h:
            await h.online(1)
            h.host.release_spares()
            await trio.sleep(10)
            await h.settle()
            assert len(h.processes) == 1
