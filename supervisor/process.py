"""Process children: a command in its own process group, ready when it says hello.

`process_child` turns "how to launch one runner" into a `ChildSpec`. Launching
goes through an injectable `Launcher`, so the supervisor's restart logic is
tested with fake processes on a MockClock; `TrioLauncher` is the real one.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import trio

from .events import ChildExited, Restart
from .policy import RestartPolicy
from .tree import ChildSpec, current_child


class ProcessHandle(Protocol):
    pid: int

    async def wait(self) -> int:
        """The returncode; negative = killed by signal -N (like subprocess)."""
        ...

    def send_signal_group(self, sig: int) -> None:
        """Signal the whole process group; no error if it is gone."""
        ...

    def close_stdin(self) -> None: ...


class Launcher(Protocol):
    async def launch(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | None,
        log_path: str | os.PathLike[str],
    ) -> ProcessHandle: ...


class TrioProcessHandle:
    """A `ProcessHandle` over a `trio.Process` that leads its own process group."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.pid = process.pid

    async def wait(self) -> int:
        return await self.process.wait()

    def send_signal_group(self, sig: int) -> None:
        # The group id is the leader's pid; it stays reserved while any member lives.
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def close_stdin(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()  # type: ignore[attr-defined]  # FdStream.close is sync


class TrioLauncher:
    """Spawns real processes: own session, stdin a pipe we hold, output appended to a log.

    The child must exit when its stdin reaches EOF (G9): then even a SIGKILLed
    supervisor leaves no orphans, since the kernel closes the pipe for us.
    """

    async def launch(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | None,
        log_path: str | os.PathLike[str],
    ) -> TrioProcessHandle:
        log_path = Path(log_path)
        log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # A child's log may quote what it was working on: private (0600), whatever the umask.
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.fchmod(fd, 0o600)
        with open(fd, "ab") as log:  # the child keeps its own copy of the fd
            process = await trio.lowlevel.open_process(
                list(argv),
                start_new_session=True,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
            )
        return TrioProcessHandle(process)


@dataclass
class ProcessConfig:
    """What one launch needs; `prepare` makes a fresh one per start, so each
    attempt can carry a new identity (e.g. a new runner id in `env`)."""

    argv: Sequence[str]
    env: Mapping[str, str] | None
    cwd: str | None
    log_path: Path
    label: Any = None  # opaque for the caller


def signal_name(signum: int) -> str:
    """"SIGKILL" for 9; "signal N" for numbers Python has no name for."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_returncode(returncode: int) -> str:
    if returncode < 0:
        return f"killed by {signal_name(-returncode)}"
    return f"exited with code {returncode}"


def read_log_tail(path: str | os.PathLike[str], lines: int = 20, max_bytes: int = 8192) -> str:
    """The last `lines` lines of a log, reading at most its last `max_bytes`.

    Plain blocking I/O on purpose: it is a few KiB, and trio's async files use threads.
    """
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    kept = text.splitlines()
    if size > max_bytes and kept:
        kept = kept[1:]  # the first line was cut by the seek
    return "\n".join(kept[-lines:]) if lines > 0 else ""


def _exited(returncode: int, config: ProcessConfig, lines: int, reason: str | None = None) -> ChildExited:
    return ChildExited(
        reason or describe_returncode(returncode),
        code=returncode if returncode >= 0 else None,
        signal=-returncode if returncode < 0 else None,
        log_tail=read_log_tail(config.log_path, lines),
    )


async def _race_ready(
    config: ProcessConfig,
    handle: ProcessHandle,
    ready: Callable[[ProcessConfig, ProcessHandle], Awaitable[None]],
) -> int | None:
    """Wait for hello or exit, whichever comes first (G10): None = ready, else the returncode."""
    returncode: int | None = None
    failure: BaseException | None = None

    async def watch_exit() -> None:
        nonlocal returncode
        returncode = await handle.wait()
        nursery.cancel_scope.cancel()

    async def watch_ready() -> None:
        await ready(config, handle)
        nursery.cancel_scope.cancel()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_exit)
            nursery.start_soon(watch_ready)
    except* Exception as group:
        failure = group.exceptions[0]
        while isinstance(failure, BaseExceptionGroup):
            failure = failure.exceptions[0]
    if returncode is None and failure is not None:
        if isinstance(failure, ChildExited):
            raise failure
        raise ChildExited(f"ready check failed: {failure!r}") from failure
    return returncode


async def _terminate(handle: ProcessHandle, grace: float) -> int:
    """EOF on stdin and SIGTERM to the group, then SIGKILL after `grace`."""
    handle.close_stdin()
    handle.send_signal_group(signal.SIGTERM)
    with trio.move_on_after(grace):
        return await handle.wait()
    handle.send_signal_group(signal.SIGKILL)
    return await handle.wait()


def process_child(
    name: str,
    prepare: Callable[[], ProcessConfig],
    *,
    ready: Callable[[ProcessConfig, ProcessHandle], Awaitable[None]] | None = None,
    launcher: Launcher | None = None,
    startup_timeout: float = 10.0,
    shutdown_grace: float = 5.0,
    restart: Restart = "permanent",
    policy: RestartPolicy | None = None,
    on_launched: Callable[[ProcessConfig, ProcessHandle], None] | None = None,
    on_exit: Callable[[ProcessConfig, ProcessHandle, int], None] | None = None,
    log_tail_lines: int = 20,
) -> ChildSpec:
    """A `ChildSpec` that runs one process per attempt.

    Each attempt: `prepare()`, launch, `on_launched`, then race `ready` against
    the process exiting and `startup_timeout` (a timeout SIGKILLs the group).
    Running until the process exits: code 0 is a normal exit, anything else
    raises `ChildExited` with the last `log_tail_lines` of its log. Stopping
    (cancellation) closes stdin, SIGTERMs the group, and SIGKILLs it after
    the spec's `shutdown_grace`. After every exit the group gets a SIGKILL so
    no grandchild outlives its runner, then `on_exit` sees the returncode.
    `Supervisor.kill_child` SIGKILLs the group. The hooks must not raise.
    """
    the_launcher: Launcher = launcher if launcher is not None else TrioLauncher()

    async def run(*, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        ctx = current_child()
        grace = ctx.shutdown_grace if ctx is not None else shutdown_grace
        config = prepare()
        Path(config.log_path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        handle = await the_launcher.launch(
            config.argv, env=config.env, cwd=config.cwd, log_path=config.log_path
        )
        if ctx is not None:
            ctx.set_killer(lambda: handle.send_signal_group(signal.SIGKILL))
        returncode: int | None = None
        try:
            if on_launched is not None:
                on_launched(config, handle)
            if ready is not None:
                try:
                    with trio.fail_after(startup_timeout):
                        returncode = await _race_ready(config, handle, ready)
                except trio.TooSlowError:
                    handle.send_signal_group(signal.SIGKILL)
                    returncode = await handle.wait()
                    raise _exited(returncode, config, log_tail_lines, "startup timeout") from None
                if returncode is not None:
                    reason = describe_returncode(returncode) + " before it was ready"
                    raise _exited(returncode, config, log_tail_lines, reason)
            task_status.started(handle.pid)
            returncode = await handle.wait()
        finally:
            with trio.CancelScope(shield=True):
                if returncode is None:
                    returncode = await _terminate(handle, grace)
                handle.send_signal_group(signal.SIGKILL)  # stragglers left in the group
                handle.close_stdin()
            assert returncode is not None  # waited for or terminated just above
            if ctx is not None:
                ctx.returncode = returncode
            if on_exit is not None:
                on_exit(config, handle, returncode)
        if returncode != 0:
            raise _exited(returncode, config, log_tail_lines)

    return ChildSpec(name, run, restart=restart, shutdown_grace=shutdown_grace, policy=policy)
