"""Turn state in the stream: a watcher sees a turn start, get interrupted, retried and end,
and a watcher that goes away changes nothing (virtual time, fake runners)."""

from __future__ import annotations

from signal import SIGKILL

import trio

from protocol import events as ev
from tests.support.fake_runners import answers, collect_until_terminal, dies_mid_turn, open_harness

TIMEOUT = 60


async def test_an_interrupted_turn_says_so_and_says_which_attempt_comes_next(autojump_clock, tmp_path):
    scripts = [dies_mid_turn(after=1.0, returncode=-SIGKILL, partial="Hel"), answers("Hello!", after=1.0)]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, scripts) as h:
            (first,) = await h.online(1)
            sid = h.new_session()
            turn = h.post(sid, "hi")
            await h.until_terminal(sid, turn["id"])
            kinds = [(s.event["type"], s.event.get("attempt"), s.event.get("reason"))
                     for s in h.watches[sid].seen
                     if s.event["type"] in (ev.RESPONSE_CREATED, ev.TURN_INTERRUPTED, ev.TURN_RETRIED,
                                            ev.COMPLETED)]
    assert kinds == [
        (ev.RESPONSE_CREATED, 1, None),
        (ev.TURN_INTERRUPTED, 1, f"runner {first} was lost"),
        (ev.TURN_RETRIED, 2, None),
        (ev.RESPONSE_CREATED, 2, None),
        (ev.COMPLETED, None, None),
    ]


async def test_a_watcher_that_goes_away_never_cancels_the_turn(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [answers("still here", after=2.0)]) as h:
            await h.online(1)
            sid = h.new_session()
            turn = h.post(sid, "hi")
            with trio.move_on_after(1.0):  # a watcher that leaves mid-turn
                await collect_until_terminal(h.hub, sid, turn["id"])
            await h.until_terminal(sid, turn["id"])
            assert h.store.get_turn(turn["id"])["status"] == "completed"
            assert [i["role"] for i in h.store.list_items(sid)] == ["user", "assistant"]
