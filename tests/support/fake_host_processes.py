"""Fake runner processes for the host pool's on-demand tests (MockClock, no subprocesses).

`FakeLauncher` is a `supervisor.Launcher`: every launch records what it was
given (argv, env, cwd, log path), touches the log file, and returns a
`FakeProcess` that lives until it is signalled (`send_signal_group`) or a
test ends it (`crash`, like an external `kill -9`). `serve_fake_server` plays
the server's side of the host link: it answers every `RunnerLaunched` with a
`RunnerOnline` and keeps every frame the host sent, for the test to read.
"""

from __future__ import annotations

import itertools
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

import protocol as p
from omnigent.link.memory import LinkEnd


@dataclass(eq=False)
class FakeProcess:
    pid: int
    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    log_path: Path
    returncode: int | None = None
    signals: list[int] = field(default_factory=list)
    _ended: trio.Event = field(default_factory=trio.Event)

    async def wait(self) -> int:
        await self._ended.wait()
        assert self.returncode is not None
        return self.returncode

    def send_signal_group(self, sig: int) -> None:
        self.signals.append(int(sig))
        if sig in (signal.SIGTERM, signal.SIGKILL):
            self._end(-int(sig))

    def close_stdin(self) -> None:
        pass

    def crash(self, returncode: int = -int(signal.SIGKILL)) -> None:
        self._end(returncode)

    def use(self) -> None:
        """What a turn does to a runner's log: it grows."""
        with open(self.log_path, "a") as f:
            f.write("turn\n")

    def _end(self, returncode: int) -> None:
        if self.returncode is None:
            self.returncode = returncode
            self._ended.set()

    @property
    def alive(self) -> bool:
        return self.returncode is None


class FakeLauncher:
    def __init__(self) -> None:
        self.processes: list[FakeProcess] = []
        self._pids = itertools.count(40000)

    async def launch(self, argv: Sequence[str], *, env: Mapping[str, str] | None, cwd: str | None,
                     log_path) -> FakeProcess:
        path = Path(log_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        proc = FakeProcess(next(self._pids), list(argv), dict(env or {}), cwd, path)
        self.processes.append(proc)
        return proc


@dataclass
class FakeServer:
    frames: list[p.Frame] = field(default_factory=list)
    changed: trio.Event = field(default_factory=trio.Event)

    def of(self, kind: type[p.Frame]) -> list:
        return [f for f in self.frames if isinstance(f, kind)]

    async def wait_for(self, kind: type[p.Frame], count: int = 1) -> list:
        while len(self.of(kind)) < count:
            self.changed = trio.Event()
            await self.changed.wait()
        return self.of(kind)


async def serve_fake_server(link: LinkEnd, server: FakeServer, *, online: bool = True) -> None:
    async for frame in link.receive:
        server.frames.append(frame)
        server.changed.set()
        if online and isinstance(frame, p.RunnerLaunched):
            link.post(p.RunnerOnline(runner_id=frame.runner_id))
