"""The shell tool: `bash -c` in the workspace, output streamed and capped, nothing left behind.

The bash gets stdin from /dev/null, a session and process group of its own,
and SIGKILL as its parent-death signal, so it dies with the runner even on a
SIGKILL. It is spawned with `subprocess.Popen` from the trio thread itself
(a fork takes a few milliseconds) rather than `trio.lowlevel.open_process`,
which forks in a worker thread: the parent-death signal fires when the
forking *thread* ends, and trio's idle worker threads do end.

When the bash exits, what is left of its group (`cmd &`, `nohup cmd &`) is
killed: a tool call is over when its command is. The exit is noticed with a
pidfd and `waitid(WNOWAIT)`, and the bash reaped only after the group kill,
so the group id cannot have been reused by then. Processes that left the
group are the runner's sweep's (see `reaper`). On a timeout or a cancel the
group gets SIGTERM, one second, then SIGKILL.

Where unprivileged user and PID namespaces work (probed once per process,
`namespace_argv`), the bash runs as PID 1 of a namespace of its own
(`unshare --user --map-current-user --pid --fork --kill-child --mount-proc`,
the parent-death signal set on `unshare`): when that init ends, by the end
of the command, a group kill, a timeout or the runner's death (`unshare`
dies with the runner, `--kill-child` passes it on), the kernel kills every
process left in the namespace, `setsid` grandchildren and double forks
included, even when the host process was SIGKILLed too. Inside, the command
sees only its own processes, `$PPID` is 0, and setuid programs (sudo) do not
gain privileges. `OMNIGENT_TOOL_PIDNS=0` turns it off; without namespaces
the subreaper sweeps (`reaper`) are what ends orphans.

Output: stdout and stderr share one pipe. The model gets the first 32 KiB
and the last 32 KiB with `[... N bytes cut ...]` between, then `exit code: N`.
Secrets are redacted at the byte level before anything is streamed or kept.
"""

from __future__ import annotations

import codecs
import os
import signal
import subprocess
from collections.abc import Awaitable, Callable, Sequence

import trio

from .definitions import SHELL_KEEP_HEAD, SHELL_KEEP_TAIL
from .reaper import OWNER_VAR, die_with_parent

STREAM_MAX = 1024 * 1024   # streamed live at most; the kept output is capped anyway
KILL_GRACE = 1.0           # SIGTERM, then this long, then SIGKILL
DRAIN_AFTER_EXIT = 0.2     # output still in the pipe once the bash has exited
REDACTED = b"[redacted]"

_running: set[int] = set()  # pids of the bashes of shell calls in progress in this process
PIDNS_VAR = "OMNIGENT_TOOL_PIDNS"
_UNSHARE = ("unshare", "--user", "--map-current-user", "--pid", "--fork", "--kill-child", "--mount-proc")
_probed: dict[bool, tuple[str, ...]] = {}  # the probe's answer, once per process


def namespace_argv() -> tuple[str, ...]:
    """The `unshare` prefix when PID namespaces work here (and are not turned off), else ().

    Probed once per process by running `unshare ... true` (a few ms, on the first shell call).
    """
    if os.environ.get(PIDNS_VAR, "1") == "0":
        return ()
    if True not in _probed:
        try:
            probe = subprocess.run([*_UNSHARE, "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, timeout=2, check=False)
            _probed[True] = _UNSHARE if probe.returncode == 0 else ()
        except (OSError, subprocess.SubprocessError):
            _probed[True] = ()
    return _probed[True]


def running_tool_pids() -> frozenset[int]:
    """The bash pids of the shell calls running now: the `keep` of the runner's sweep."""
    return frozenset(_running)


class _Output:
    """Collects the combined output: a head, a tail, a count of what was cut; redacts bytes."""

    def __init__(self, secrets: Sequence[str]) -> None:
        self.secrets = sorted({s.encode() for s in secrets if s}, key=len, reverse=True)
        self.pad = max((len(s) for s in self.secrets), default=1) - 1
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self._pending = b""            # streamed-not-yet: held back in case a secret straddles chunks
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.streamed = 0

    def _redact(self, data: bytes) -> bytes:
        for secret in self.secrets:
            if secret in data:
                data = data.replace(secret, REDACTED)
        return data

    def add(self, data: bytes) -> str:
        """Keep `data`; return the text that may be streamed now (redacted)."""
        self.total += len(data)
        room = SHELL_KEEP_HEAD + self.pad - len(self.head)
        if room > 0:
            self.head += data[:room]
        self.tail += data
        if len(self.tail) > SHELL_KEEP_TAIL + self.pad:
            del self.tail[: len(self.tail) - SHELL_KEEP_TAIL - self.pad]
        ready = self._redact(self._pending + data)
        hold = self._held(ready)
        ready, self._pending = ready[:len(ready) - hold], ready[len(ready) - hold:]
        return self._decoder.decode(ready)

    def _held(self, data: bytes) -> int:
        """How many trailing bytes could be the start of a secret: those wait for the next chunk."""
        best = 0
        for secret in self.secrets:
            for k in range(min(len(secret) - 1, len(data)), best, -1):
                if data.endswith(secret[:k]):
                    best = k
                    break
        return best

    def flush(self) -> str:
        ready, self._pending = self._redact(self._pending), b""
        return self._decoder.decode(ready, final=True)

    def text(self) -> str:
        """What the model gets: head, a cut notice, tail; redacted."""
        keep = SHELL_KEEP_HEAD + SHELL_KEEP_TAIL
        if self.total <= keep:  # all of it is in head + the end of tail
            rest = self.total - len(self.head)
            whole = bytes(self.head) + (bytes(self.tail[-rest:]) if rest > 0 else b"")
            return self._redact(whole).decode("utf-8", errors="replace")
        head = self._redact(bytes(self.head))[:SHELL_KEEP_HEAD]
        tail = self._redact(bytes(self.tail))[-SHELL_KEEP_TAIL:]
        cut = self.total - SHELL_KEEP_HEAD - SHELL_KEEP_TAIL
        return (head.decode("utf-8", errors="replace") + f"\n[... {cut} bytes cut ...]\n"
                + tail.decode("utf-8", errors="replace"))


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class _Bash:
    """The bash process: exit is noticed without reaping it, so its pid (the group's id) stays
    reserved until the group has been killed; only then is it reaped."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self.popen = popen
        _running.add(popen.pid)
        try:
            self.pidfd: int | None = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):
            self.pidfd = None  # no pidfd (old kernel): poll

    def has_exited(self) -> bool:
        if self.popen.returncode is not None:
            return True
        try:
            return os.waitid(os.P_PID, self.popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    async def exited(self) -> None:
        while not self.has_exited():
            if self.pidfd is not None:
                await trio.lowlevel.wait_readable(self.pidfd)
            else:
                await trio.sleep(0.02)

    def kill_group(self, sig: int) -> None:
        if self.popen.returncode is None:  # reaped: the group id may belong to someone else now
            _kill_group(self.popen.pid, sig)

    def reap(self) -> None:
        if self.has_exited():
            self.popen.wait()

    async def stop(self) -> None:
        """TERM the group, give it a second, KILL it; reap the bash. Bounded (about 2 s)."""
        self.kill_group(signal.SIGTERM)
        with trio.move_on_after(KILL_GRACE):
            await self.exited()
        self.kill_group(signal.SIGKILL)
        with trio.move_on_after(1.0):
            await self.exited()
        self.reap()

    def close(self) -> None:
        _running.discard(self.popen.pid)
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"exit code: {128 - code} (killed by {name})"
    return f"exit code: {code}"


def spawn(command: str, workspace: str, env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    """The bash, and the read end of its combined output pipe. From the trio thread (see above)."""
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    parent = os.getpid()
    try:
        popen = subprocess.Popen(
            [*namespace_argv(), "bash", "-c", command], cwd=workspace, env={**env, OWNER_VAR: str(parent)},
            stdin=subprocess.DEVNULL, stdout=write_fd, stderr=write_fd, close_fds=True,
            start_new_session=True, preexec_fn=lambda: die_with_parent(parent))
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return popen, read_fd


async def run_shell(command: str, *, workspace: str, env: dict[str, str], timeout_s: float,
                    secrets: Sequence[str], captured: list[str],
                    on_output: Callable[[str], Awaitable[None]] | None) -> tuple[str, str, int | None]:
    """(status, output, exit code) of one command; see the module docstring."""
    out = _Output(secrets)
    try:
        popen, read_fd = spawn(command, workspace, env)
    except OSError as exc:
        return "error", f"cannot start bash: {exc.strerror or exc}", None
    stream = trio.lowlevel.FdStream(read_fd)
    bash = _Bash(popen)

    async def emit(text: str) -> None:
        if not text or out.streamed >= STREAM_MAX:  # past that, only the final head and tail count
            return
        out.streamed += len(text)
        if out.streamed >= STREAM_MAX:
            text += "\n[... live output stops here; the result keeps the first and last 32 KiB ...]\n"
        captured.append(text)
        if on_output is not None:
            await on_output(text)

    eof = trio.Event()

    async def pump() -> None:
        while data := await stream.receive_some(65536):
            await emit(out.add(data))
        eof.set()

    status = "completed"
    finished = False
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump)
            with trio.move_on_after(timeout_s) as timer:
                await bash.exited()
            if timer.cancelled_caught:
                status = "timeout"
                await bash.stop()
            else:
                bash.kill_group(signal.SIGKILL)  # what the command left running in its group
                bash.reap()
            with trio.move_on_after(DRAIN_AFTER_EXIT):  # a setsid orphan may hold the pipe open
                await eof.wait()
            nursery.cancel_scope.cancel()
        await emit(out.flush())
        finished = True
    finally:
        stream.close()
        if not finished:  # cancelled, or on_output failed: nothing of the command may stay
            with trio.CancelScope(shield=True):
                await bash.stop()
            captured[:] = [out.text()]
        bash.close()
    text = out.text()
    code = popen.returncode
    if status == "timeout":
        text = (text.rstrip("\n") + "\n" if text else "") + (
            f"[timed out after {timeout_s:g} s: the command and everything it started were killed]")
        return "timeout", text, code
    body = text.rstrip("\n") if text else "(no output)"
    return "completed", f"{body}\n{describe_exit(code)}", code

