"""Supervisor timelines on a MockClock with fake processes: exact, in virtual seconds.

A FakeProcess "lives" until a virtual deadline (or a signal), so every restart
delay, timeout and grace shows up as an exact timestamp in the event stream.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import trio

from supervisor import (
    ChildExited,
    ChildSpec,
    Event,
    GaveUp,
    ProcessConfig,
    RestartPolicy,
    Supervisor,
    process_child,
)

SIGTERM, SIGKILL = int(signal.SIGTERM), int(signal.SIGKILL)


@dataclass
class Behaviour:
    lifetime: float = math.inf
    rc: int = 1
    ignore_term: bool = False


class FakeProcess:
    def __init__(self, pid: int, behaviour: Behaviour) -> None:
        self.pid = pid
        self.behaviour = behaviour
        self.deadline = trio.current_time() + behaviour.lifetime
        self.returncode: int | None = None
        self.signals: list[tuple[float, int]] = []
        self.stdin_closed_at: float | None = None
        self._exited = trio.Event()

    def _die(self, rc: int) -> None:
        if self.returncode is None:
            self.returncode = rc
            self._exited.set()

    async def wait(self) -> int:
        # An absolute deadline, so a second wait() does not restart the lifetime.
        with trio.move_on_at(self.deadline):
            await self._exited.wait()
        self._die(self.behaviour.rc)
        return self.returncode

    def send_signal_group(self, sig: int) -> None:
        self.signals.append((trio.current_time(), int(sig)))
        if sig == SIGKILL or (sig == SIGTERM and not self.behaviour.ignore_term):
            self._die(-int(sig))

    def close_stdin(self) -> None:
        if self.stdin_closed_at is None:
            self.stdin_closed_at = trio.current_time()


@dataclass
class FakeLauncher:
    """Launches FakeProcesses; `behave(n)` decides how the n-th launch (from 0) behaves."""

    behave: Callable[[int], Behaviour] = lambda n: Behaviour()
    processes: list[FakeProcess] = field(default_factory=list)

    async def launch(self, argv, *, env, cwd, log_path) -> FakeProcess:
        n = len(self.processes)
        with open(log_path, "a") as log:
            log.write(f"attempt {n} of {argv[0]}\nboom {n}\n")
        process = FakeProcess(1000 + n, self.behave(n))
        self.processes.append(process)
        return process


def fake_child(name, launcher, tmp_path, **kwargs) -> ChildSpec:
    def prepare() -> ProcessConfig:
        return ProcessConfig([name], None, None, tmp_path / "logs" / f"{name}.log")

    return process_child(name, prepare, launcher=launcher, **kwargs)


def always(**kwargs) -> Callable[[int], Behaviour]:
    return lambda n: Behaviour(**kwargs)


def drain(channel: trio.MemoryReceiveChannel[Event]) -> list[Event]:
    events = []
    while True:
        try:
            events.append(channel.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return events


async def next_event(channel, kind: str, child: str | None = None) -> Event:
    async for event in channel:
        if event.kind == kind and child in (None, event.child):
            return event
    raise AssertionError(f"channel closed before {kind}")


def times(events: list[Event], kind: str, child: str | None = None) -> list[float]:
    return [e.time for e in events if e.kind == kind and child in (None, e.child)]


async def never_ready(config, handle) -> None:
    await trio.sleep_forever()


POLICY = RestartPolicy(base=0.5, factor=2, jitter=0, intensity=5, period=60)


async def test_backoff_timeline_then_gave_up(autojump_clock, tmp_path):
    launcher = FakeLauncher(always(lifetime=1, rc=1))
    sup = Supervisor(POLICY)
    channel = sup.subscribe()
    with pytest.raises(GaveUp) as info:
        await sup.run([fake_child("a", launcher, tmp_path)])
    events = drain(channel)
    assert times(events, "starting") == [0, 1.5, 3.5, 6.5, 11.5, 20.5]
    assert times(events, "gave_up") == [21.5]
    assert [e.delay for e in events if e.kind == "restarting"] == [0.5, 1, 2, 4, 8]
    assert [(e.kind, e.time, e.pid, e.code, e.reason) for e in events[:5]] == [
        ("starting", 0, None, None, None),
        ("running", 0, 1000, None, None),
        ("exited", 1, 1000, 1, "exited with code 1"),
        ("restarting", 1, None, None, "exited with code 1"),
        ("starting", 1.5, None, None, None),
    ]
    error = info.value
    assert error.child == "a" and error.reason == "exited with code 1"
    assert "'a'" in str(error) and "exited with code 1" in str(error) and "\n" not in str(error)
    assert error.log_tail.splitlines()[-2:] == ["attempt 5 of a", "boom 5"]
    # the channel is closed once run is over
    with pytest.raises(trio.EndOfChannel):
        channel.receive_nowait()


async def test_healthy_run_resets_backoff(autojump_clock, tmp_path):
    lifetimes = [1, 1, 40, 1, math.inf]
    launcher = FakeLauncher(lambda n: Behaviour(lifetime=lifetimes[n]))
    sup = Supervisor(RestartPolicy(base=0.5, factor=2, jitter=0, reset_after=30, intensity=10))
    channel = sup.subscribe()
    seen = []
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run, [fake_child("a", launcher, tmp_path)])
        async for event in channel:
            seen.append(event)
            if event.kind == "running" and event.pid == 1004:
                break
        nursery.cancel_scope.cancel()
    # 1 s, 1 s, then a 40 s healthy run: its restart waits `base` again
    assert times(seen, "starting") == [0, 1.5, 3.5, 44, 46]
    assert [e.delay for e in seen if e.kind == "restarting"] == [0.5, 1, 0.5, 1]


@pytest.mark.parametrize(
    ("restart", "rc", "restarted"),
    [
        ("permanent", 0, True),
        ("permanent", 2, True),
        ("transient", 0, False),
        ("transient", 2, True),
        ("temporary", 0, False),
        ("temporary", 2, False),
    ],
)
async def test_restart_types(autojump_clock, tmp_path, restart, rc, restarted):
    launcher = FakeLauncher(always(lifetime=1, rc=rc))
    sup = Supervisor(POLICY)
    channel = sup.subscribe()
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run, [fake_child("a", launcher, tmp_path, restart=restart)])
        exited = await next_event(channel, "exited")
        assert (exited.time, exited.code) == (1, rc)
        assert exited.reason == ("exited normally" if rc == 0 else f"exited with code {rc}")
        await trio.sleep(10)
        # run keeps going even when no child is left: it only ends by cancellation
        assert ("a" in sup.children()) is restarted
        nursery.cancel_scope.cancel()
    assert (len(launcher.processes) > 1) is restarted


async def test_startup_timeout_kills_and_restarts(autojump_clock, tmp_path):
    launcher = FakeLauncher(always())
    sup = Supervisor(POLICY)
    channel = sup.subscribe()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sup.run, [fake_child("a", launcher, tmp_path, ready=never_ready, startup_timeout=2)])
        exited = await next_event(channel, "exited")
        restarting = await next_event(channel, "restarting")
        starting = await next_event(channel, "starting")
        nursery.cancel_scope.cancel()
    assert (exited.time, exited.reason, exited.signal) == (2, "startup timeout", SIGKILL)
    assert launcher.processes[0].signals[0] == (2, SIGKILL)
    assert (restarting.delay, starting.time) == (0.5, 2.5)


async def test_exit_before_ready(autojump_clock, tmp_path):
    launcher = FakeLauncher(always(lifetime=1, rc=2))
    sup = Supervisor(POLICY)
    channel = sup.subscribe()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sup.run, [fake_child("a", launcher, tmp_path, ready=never_ready)])
        exited = await next_event(channel, "exited")
        nursery.cancel_scope.cancel()
    assert (exited.time, exited.code, exited.reason) == (1, 2, "exited with code 2 before it was ready")
    assert not any(e.kind == "running" for e in drain(channel))


async def test_ready_takes_time_and_start_reports_once_running(autojump_clock, tmp_path):
    async def slow_ready(config, handle):
        await trio.sleep(3)

    launcher = FakeLauncher(always())
    sup = Supervisor(POLICY)
    async with trio.open_nursery() as nursery:
        assert await nursery.start(sup.run, [fake_child("a", launcher, tmp_path, ready=slow_ready)]) is sup
        assert trio.current_time() == 3
        info = sup.children()["a"]
        assert (info.state, info.pid, info.restarts, info.started_at) == ("running", 1000, 0, 0)
        nursery.cancel_scope.cancel()


async def test_kill_child_restarts_with_reason(autojump_clock, tmp_path):
    launched, exits = [], []
    launcher = FakeLauncher(always())
    spec = fake_child(
        "a",
        launcher,
        tmp_path,
        on_launched=lambda config, handle: launched.append(handle.pid),
        on_exit=lambda config, handle, rc: exits.append((handle.pid, rc)),
    )
    sup = Supervisor(POLICY)
    channel = sup.subscribe()
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run, [spec])
        await trio.sleep(5)
        sup.kill_child("a", "hung: missed pings")
        exited = await next_event(channel, "exited")
        running = await next_event(channel, "running")
        assert sup.children()["a"].restarts == 1
        nursery.cancel_scope.cancel()
    assert (exited.time, exited.pid, exited.signal, exited.reason) == (5, 1000, SIGKILL, "hung: missed pings")
    assert launcher.processes[0].signals[0] == (5, SIGKILL)
    assert (running.time, running.pid) == (5.5, 1001)
    assert launched == [1000, 1001]
    assert exits == [(1000, -SIGKILL), (1001, -SIGTERM)]


async def test_kill_child_without_killer_cancels_the_attempt(autojump_clock):
    async def forever(*, task_status=trio.TASK_STATUS_IGNORED):
        task_status.started()
        await trio.sleep_forever()

    sup = Supervisor(POLICY)
    channel = sup.subscribe()
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run, [ChildSpec("plain", forever)])
        await trio.sleep(2)
        sup.kill_child("plain", "hung")
        exited = await next_event(channel, "exited")
        starting = await next_event(channel, "starting")
        nursery.cancel_scope.cancel()
    assert (exited.time, exited.reason, starting.time) == (2, "hung", 2.5)


async def test_crashing_run_function_is_an_abnormal_exit(autojump_clock):
    async def broken(*, task_status=trio.TASK_STATUS_IGNORED):
        task_status.started()
        await trio.sleep(1)
        raise ValueError("bad state")

    sup = Supervisor(POLICY)
    with pytest.raises(GaveUp) as info:
        await sup.run([ChildSpec("plain", broken, restart="transient")])
    assert info.value.reason == "crashed: ValueError: bad state"


async def test_stop_child_stops_for_good(autojump_clock, tmp_path):
    launcher = FakeLauncher(always())
    sup = Supervisor(POLICY)
    channel = sup.subscribe()
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run, [fake_child("a", launcher, tmp_path), fake_child("b", launcher, tmp_path)])
        await trio.sleep(4)
        await sup.stop_child("a")
        assert trio.current_time() == 4
        assert list(sup.children()) == ["b"]
        await trio.sleep(100)
        await sup.stop_child("a")  # already gone: no-op
        nursery.cancel_scope.cancel()
    a = launcher.processes[0]
    assert (a.stdin_closed_at, a.signals[0]) == (4, (4, SIGTERM))
    events = [(e.kind, e.child, e.time, e.signal) for e in drain(channel) if e.kind.startswith("stop")]
    assert events == [
        ("stopping", "a", 4, None),
        ("stopped", "a", 4, SIGTERM),
        ("stopping", "b", 104, None),
        ("stopped", "b", 104, SIGTERM),
    ]
    assert len(launcher.processes) == 2


async def test_shutdown_is_reverse_order_with_grace_then_kill(autojump_clock, tmp_path):
    stubborn = {"a": True, "b": False, "c": True}
    launcher = FakeLauncher(lambda n: Behaviour(ignore_term=stubborn["abc"[n]]))
    specs = [
        fake_child("a", launcher, tmp_path, shutdown_grace=3),
        fake_child("b", launcher, tmp_path, shutdown_grace=5),
        fake_child("c", launcher, tmp_path, shutdown_grace=2),
    ]
    sup = Supervisor(POLICY)
    channel = sup.subscribe()
    with trio.move_on_after(10):
        await sup.run(specs)
    assert trio.current_time() == 15
    events = [(e.kind, e.child, e.time, e.signal) for e in drain(channel) if e.kind.startswith("stop")]
    assert events == [
        ("stopping", "c", 10, None),
        ("stopped", "c", 12, SIGKILL),
        ("stopping", "b", 12, None),
        ("stopped", "b", 12, SIGTERM),
        ("stopping", "a", 12, None),
        ("stopped", "a", 15, SIGKILL),
    ]
    a, b, c = launcher.processes
    assert c.signals[:2] == [(10, SIGTERM), (12, SIGKILL)]
    assert a.signals[:2] == [(12, SIGTERM), (15, SIGKILL)]


async def test_gave_up_stops_the_other_children_first(autojump_clock, tmp_path):
    launcher = FakeLauncher(lambda n: Behaviour() if n == 0 else Behaviour(lifetime=1, rc=7))
    sup = Supervisor(RestartPolicy(base=1, jitter=0, intensity=1))
    channel = sup.subscribe()
    with pytest.raises(GaveUp) as info:
        await sup.run([fake_child("healthy", launcher, tmp_path), fake_child("flaky", launcher, tmp_path)])
    assert info.value.child == "flaky"
    events = [(e.kind, e.child, e.time) for e in drain(channel) if e.kind in ("gave_up", "stopping", "stopped")]
    # flaky: runs 0-1, waits 1, runs 2-3, then a second restart within 60 s is too many
    assert events == [("gave_up", "flaky", 3), ("stopping", "healthy", 3), ("stopped", "healthy", 3)]
    assert launcher.processes[0].returncode == -SIGTERM


async def test_gave_up_while_another_child_is_still_starting_stops_it_at_once(autojump_clock, tmp_path):
    """Found by the recovery simulation (tests/sim, seed 2626): the start-up loop waited for the
    slow starter to get running and kept restarting it after the first child had given up."""
    async def slow_ready(config, handle):
        await trio.sleep(10)

    launcher = FakeLauncher(lambda n: Behaviour(lifetime=1, rc=7) if n != 1 else Behaviour())
    sup = Supervisor(RestartPolicy(base=1, jitter=0, intensity=1))
    channel = sup.subscribe()
    with pytest.raises(GaveUp) as info:
        await sup.run([fake_child("flaky", launcher, tmp_path),
                       fake_child("slow", launcher, tmp_path, ready=slow_ready)])
    assert info.value.child == "flaky" and trio.current_time() == 3
    events = [(e.kind, e.child, e.time) for e in drain(channel) if e.kind != "exited"]
    # flaky: runs 0-1, waits 1, runs 2-3, gives up; slow (launched at 0) is stopped then, not at 10
    assert events == [("starting", "flaky", 0), ("running", "flaky", 0), ("starting", "slow", 0),
                      ("restarting", "flaky", 1), ("starting", "flaky", 2), ("running", "flaky", 2),
                      ("gave_up", "flaky", 3), ("stopping", "slow", 3), ("stopped", "slow", 3)]


async def test_dynamic_start_child(autojump_clock, tmp_path):
    async def slow_ready(config, handle):
        await trio.sleep(2)

    launcher = FakeLauncher(always())
    sup = Supervisor(POLICY)
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        assert sup.children() == {}
        await sup.start_child(fake_child("late", launcher, tmp_path, ready=slow_ready))
        assert trio.current_time() == 2 and sup.children()["late"].state == "running"
        with pytest.raises(ValueError):
            await sup.start_child(fake_child("late", launcher, tmp_path))
        nursery.cancel_scope.cancel()


async def test_start_child_that_never_gets_running(autojump_clock, tmp_path):
    launcher = FakeLauncher(always(lifetime=1, rc=4))
    sup = Supervisor(POLICY)
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        with pytest.raises(ChildExited) as info:
            await sup.start_child(fake_child("once", launcher, tmp_path, ready=never_ready, restart="temporary"))
        assert info.value.reason == "exited with code 4 before it was ready"
        assert info.value.code == 4 and "boom 0" in info.value.log_tail
        nursery.cancel_scope.cancel()


async def test_start_child_that_gives_up_fails_the_supervisor(autojump_clock, tmp_path):
    launcher = FakeLauncher(always(lifetime=1, rc=4))
    sup = Supervisor(POLICY)
    with pytest.RaisesGroup(GaveUp, GaveUp):  # from start_child and from run
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            await sup.start_child(fake_child("doomed", launcher, tmp_path, ready=never_ready))
    assert len(launcher.processes) == 6


async def test_full_subscriber_drops_instead_of_blocking(autojump_clock, tmp_path):
    launcher = FakeLauncher(always(lifetime=1, rc=1))
    sup = Supervisor(POLICY)
    small, full = sup.subscribe(max_buffer=2), sup.subscribe()
    with pytest.raises(GaveUp):
        await sup.run([fake_child("a", launcher, tmp_path)])
    assert [e.kind for e in drain(small)] == ["starting", "running"]
    assert len(drain(full)) == 6 * 4


async def test_giving_up_before_started_raises_from_nursery_start(autojump_clock, tmp_path):
    launcher = FakeLauncher(always(lifetime=1, rc=9))
    sup = Supervisor(RestartPolicy(base=1, jitter=0, intensity=2))
    async with trio.open_nursery() as nursery:
        with pytest.raises(GaveUp) as info:
            await nursery.start(sup.run, [fake_child("a", launcher, tmp_path, ready=never_ready)])
    assert info.value.reason == "exited with code 9 before it was ready"
    assert trio.current_time() == 1 + 1 + 1 + 2 + 1


async def test_run_refuses_duplicate_names_and_a_second_run(autojump_clock, tmp_path):
    launcher = FakeLauncher(always())
    with pytest.raises(ValueError):
        await Supervisor().run([fake_child("a", launcher, tmp_path), fake_child("a", launcher, tmp_path)])
    sup = Supervisor()
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        with pytest.raises(RuntimeError):
            await sup.run()
        nursery.cancel_scope.cancel()
    assert launcher.processes == []
