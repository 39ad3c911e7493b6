"""When the server pings its runners, deterministically (MockClock, memory channels).

Pings go out on the ticks of one grid of `ping_interval` on trio's clock, so an idle
server wakes once an interval for all its runners; a runner heard from within the
last half interval is not pinged; the hang verdict still counts from the runner's last frame.
"""

from __future__ import annotations

import pytest
import trio

import protocol as p
from omnigent.server.ticks import next_tick
from tests.support.fake_runners import open_harness
from tests.unit.test_runner_credentials import Peer, credential, online


async def test_every_runner_is_pinged_on_the_same_ticks(tmp_path, autojump_clock):
    async with open_harness(tmp_path, runners=0) as h:
        first = Peer(h, "runner_a", credential(h, "runner_a")).start()
        await online(h, first)
        await trio.sleep(0.3)
        second = Peer(h, "runner_b", credential(h, "runner_b")).start()
        await online(h, second)
        start = trio.current_time()
        await trio.sleep(3.5)
        ticks = [next_tick(start, 1.0) + k for k in range(3)]
        assert [t for t in first.pinged if t > start] == pytest.approx(ticks)
        # the second was heard (its hello) 0.7 s before the first tick: pinged at it too
        assert second.pinged == pytest.approx(ticks)
        assert all(t == pytest.approx(round(t)) for t in first.pinged + second.pinged)


async def test_a_runner_heard_from_within_the_interval_is_not_pinged(tmp_path, autojump_clock):
    async with open_harness(tmp_path, runners=0) as h:
        busy = Peer(h, "runner_busy", credential(h, "runner_busy")).start()
        await online(h, busy)
        start = trio.current_time()
        for _ in range(20):  # a frame every 0.25 s for 5 s, as a turn's events come
            busy.send(p.Pong(ts=0.0))
            await trio.sleep(0.25)
        assert [t for t in busy.pinged if t > start] == []
        await trio.sleep(3.5)  # quiet: pinged again at every tick, and answering
        assert len([t for t in busy.pinged if t > start + 5.0]) == 3
        assert h.registry.online.get("runner_busy") is not None and not busy.served.is_set()


async def test_a_skipped_ping_never_makes_a_live_runner_look_hung(tmp_path, autojump_clock):
    # an allowance under two intervals: a runner heard 0.6 s before a tick is still pinged at it,
    # else it would be silent 1.6 s > 1.5 s at the next tick, though it answers every ping
    async with open_harness(tmp_path, runners=0, ping_allowance=1.5) as h:
        peer = Peer(h, "runner_a", credential(h, "runner_a")).start()
        await online(h, peer)
        tick = next_tick(trio.current_time(), 1.0)
        await trio.sleep_until(tick + 0.4)
        peer.send(p.Pong(ts=0.0))  # heard 0.6 s before the next tick
        await trio.sleep(5.0)
        assert tick + 1.0 in [pytest.approx(t) for t in peer.pinged]
        assert h.registry.online.get("runner_a") is not None and not peer.served.is_set()


async def test_a_silent_runner_is_still_judged_hung_from_its_last_frame(tmp_path, autojump_clock):
    async with open_harness(tmp_path, runners=0, ping_allowance=3.0) as h:
        peer = Peer(h, "runner_a", credential(h, "runner_a")).start()
        await online(h, peer)
        tick = next_tick(trio.current_time(), 1.0)
        await trio.sleep_until(tick + 0.7)
        peer.silence()
        peer.send(p.Pong(ts=0.0))  # its last frame
        await peer.served.wait()
        # not pinged at tick+1 (heard 0.3 s before), pinged unanswered at +2 and +3; at +4 silent 3.3 s > 3 s
        assert [t for t in peer.pinged if t > tick] == pytest.approx([tick + 2.0, tick + 3.0])
        assert trio.current_time() == pytest.approx(tick + 4.0)
        assert h.registry.departed["runner_a"].cause == "hung: no answer to pings for 3.3 s"


def test_the_next_tick_is_strictly_after_now():
    assert next_tick(0.0, 1.0) == 1.0
    assert next_tick(2.999, 1.0) == 3.0
    assert next_tick(3.0, 1.0) == 4.0
    assert next_tick(0.25, 0.1) == pytest.approx(0.3)
