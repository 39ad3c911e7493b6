"""The supervisor with real processes on the real clock (never autojump: G11).

Children are `_supervisor_children/child.py`: they say hello over TCP to a
listener the test runs, and `ready` waits for that hello, as the host waits
for a runner's websocket hello. Deaths of processes we are not the parent of
are awaited with pidfds, which also see zombies as dead (G15).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import trio

from supervisor import (
    GaveUp,
    ProcessConfig,
    RestartPolicy,
    Supervisor,
    TrioLauncher,
    process_child,
)

CHILDREN = Path(__file__).with_name("_supervisor_children")
REPO = Path(__file__).resolve().parents[2]
FAST = RestartPolicy(base=0.05, factor=2, cap=1, jitter=0, intensity=3, period=10)


class HelloServer:
    """Collects children's hellos; each start attempt gets a fresh token (its `label`)."""

    def __init__(self) -> None:
        self.port = 0
        self.hellos: dict[str, tuple[int, int | None]] = {}  # token -> (pid, grandchild pid)
        self._arrived: dict[str, trio.Event] = {}

    def _event(self, token: str) -> trio.Event:
        return self._arrived.setdefault(token, trio.Event())

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        await trio.serve_listeners(self._handle, listeners, task_status=task_status)

    async def _handle(self, stream: trio.SocketStream) -> None:
        data = b""
        async with stream:
            while not data.endswith(b"\n"):
                chunk = await stream.receive_some()
                if not chunk:
                    return
                data += chunk
        _, token, pid, grandchild = data.decode().split()
        self.hellos[token] = (int(pid), None if grandchild == "-" else int(grandchild))
        self._event(token).set()

    async def wait_hello(self, token: str) -> tuple[int, int | None]:
        await self._event(token).wait()
        return self.hellos[token]

    async def ready(self, config: ProcessConfig, handle) -> None:
        await self.wait_hello(config.label)

    def env(self, token: str) -> dict[str, str]:
        return {**os.environ, "CHILD_PORT": str(self.port), "CHILD_TOKEN": token}

    def child(self, name: str, mode: str, tmp_path: Path, **kwargs):
        def prepare() -> ProcessConfig:
            token = uuid.uuid4().hex
            argv = [sys.executable, str(CHILDREN / "child.py"), mode]
            return ProcessConfig(argv, self.env(token), None, tmp_path / "logs" / f"{name}.log", token)

        kwargs.setdefault("startup_timeout", 5)
        return process_child(name, prepare, ready=self.ready, **kwargs)


@pytest.fixture
async def hello(nursery):
    server = HelloServer()
    await nursery.start(server.serve)
    return server


async def next_event(channel, kind: str, child: str | None = None):
    async for event in channel:
        if event.kind == kind and child in (None, event.child):
            return event
    raise AssertionError(f"channel closed before {kind}")


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


async def wait_gone(pidfd: int) -> None:
    """A pidfd becomes readable when its process exits, zombie or not."""
    try:
        await trio.lowlevel.wait_readable(pidfd)
    finally:
        os.close(pidfd)


async def test_sigkilled_child_is_restarted_with_a_new_pid(hello, tmp_path):
    sup = Supervisor(FAST)
    events = sup.subscribe()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run, [hello.child("a", "normal", tmp_path)])
            pid = sup.children()["a"].pid
            os.kill(pid, signal.SIGKILL)
            exited = await next_event(events, "exited")
            running = await next_event(events, "running")
            nursery.cancel_scope.cancel()
    assert (exited.pid, exited.signal, exited.code, exited.reason) == (pid, 9, None, "killed by SIGKILL")
    assert running.pid != pid and not alive(pid) and not alive(running.pid)
    assert sorted(p for p, _ in hello.hellos.values()) == sorted([pid, running.pid])


async def test_kill_child_sigkills_the_process_and_restarts_it(hello, tmp_path):
    sup = Supervisor(FAST)
    events = sup.subscribe()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run, [hello.child("a", "stubborn", tmp_path, shutdown_grace=0.2)])
            pid = sup.children()["a"].pid
            sup.kill_child("a", "hung: missed pings")
            exited = await next_event(events, "exited")
            running = await next_event(events, "running")
            nursery.cancel_scope.cancel()
    assert (exited.pid, exited.signal, exited.reason) == (pid, 9, "hung: missed pings")
    assert running.pid != pid


async def test_crash_loop_gives_up_with_reason_and_log_tail(hello, tmp_path):
    sup = Supervisor(FAST)
    events = sup.subscribe()
    with trio.fail_after(5), pytest.raises(GaveUp) as info:
        await sup.run([hello.child("crasher", "crash", tmp_path)])
    assert info.value.reason == "exited with code 3 before it was ready"
    assert "crasher" in str(info.value) and "exited with code 3" in str(info.value)
    assert info.value.log_tail.splitlines()[-1] == "boom: cannot start, crashing on purpose"
    history = []
    async for event in events:  # closed when run ended
        history.append(event)
    assert [e.delay for e in history if e.kind == "restarting"] == [0.05, 0.1, 0.2]
    assert history[-1].kind == "gave_up"


async def test_cancelling_the_supervisor_leaves_no_process_behind(hello, tmp_path):
    sup = Supervisor(FAST)
    events = sup.subscribe()
    specs = [hello.child("a", "normal", tmp_path), hello.child("b", "grandchild", tmp_path)]
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run, specs)
            pids = [info.pid for info in sup.children().values()]
            [grandchild] = [g for _, g in hello.hellos.values() if g is not None]
            grandchild_fd = os.pidfd_open(grandchild)
            assert alive(grandchild)
            nursery.cancel_scope.cancel()
        await wait_gone(grandchild_fd)
    # our own children were reaped by trio: not even zombies remain
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
    history = []
    async for event in events:
        history.append(event)
    assert [(e.kind, e.child) for e in history if e.kind.startswith("stop")] == [
        ("stopping", "b"),
        ("stopped", "b"),
        ("stopping", "a"),
        ("stopped", "a"),
    ]


async def test_grandchild_dies_with_its_group(hello, tmp_path):
    sup = Supervisor(FAST)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run, [hello.child("a", "grandchild", tmp_path)])
            [(_, grandchild)] = hello.hellos.values()
            grandchild_fd = os.pidfd_open(grandchild)
            await sup.stop_child("a")
            await wait_gone(grandchild_fd)
            nursery.cancel_scope.cancel()


async def test_child_ignoring_sigterm_is_sigkilled_after_the_grace(hello, tmp_path):
    sup = Supervisor(FAST)
    events = sup.subscribe()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run, [hello.child("a", "stubborn", tmp_path, shutdown_grace=0.3)])
            await sup.stop_child("a")
            stopping = await next_event(events, "stopping")
            stopped = await next_event(events, "stopped")
            nursery.cancel_scope.cancel()
    assert stopped.signal == 9
    assert 0.3 <= stopped.time - stopping.time < 1.5
    assert "stdin closed" in (tmp_path / "logs" / "a.log").read_text()


async def test_child_exits_when_its_stdin_closes(hello, tmp_path):
    token = uuid.uuid4().hex
    argv = [sys.executable, str(CHILDREN / "child.py"), "normal"]
    handle = await TrioLauncher().launch(argv, env=hello.env(token), cwd=None, log_path=tmp_path / "new" / "c.log")
    try:
        with trio.fail_after(5):
            await hello.wait_hello(token)
            handle.close_stdin()
            assert await handle.wait() == 0
    finally:
        handle.send_signal_group(signal.SIGKILL)
        with trio.CancelScope(shield=True):
            await handle.wait()
    assert "stdin closed" in (tmp_path / "new" / "c.log").read_text()


async def test_sigkilled_supervisor_leaves_no_orphan(hello, tmp_path):
    token = uuid.uuid4().hex
    env = {**hello.env(token), "PYTHONPATH": str(REPO)}
    argv = [sys.executable, str(CHILDREN / "mini_supervisor.py"), str(tmp_path / "orphan.log")]
    mini = await trio.lowlevel.open_process(argv, env=env, stdin=subprocess.DEVNULL)
    try:
        with trio.fail_after(5):
            child_pid, _ = await hello.wait_hello(token)
            child_fd = os.pidfd_open(child_pid)
            mini.kill()
            await mini.wait()
            await wait_gone(child_fd)  # it saw EOF on the stdin pipe its supervisor held
    finally:
        mini.kill()
        with trio.CancelScope(shield=True):
            await mini.wait()
    assert "stdin closed" in (tmp_path / "orphan.log").read_text()
