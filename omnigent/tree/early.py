"""The first runner of `omnigent run`, spawned right after argument parsing.

A cold `omnigent run -p` waits mostly for its runner to import openai. The
tree (trio, protocol, the supervisor, the host) takes ~0.2 s to import
before the host can launch anything, so the CLI spawns the runner process
itself first, with only the standard library loaded, and the host adopts it
as its first launch (`EarlyLauncher`, the supervisor's `Launcher` hook).

The runner does not know who it is yet: its id, its secret, the server's
URL and the host's tool policy are minted by the host at launch. So the
process starts with `OMNIGENT_RUNNER_IDENTITY_FD` naming a pipe and
imports openai meanwhile; adoption writes one JSON object on that pipe
(the environment the host meant to give it, as a difference from the one
it has, and its log path) and closes it. The secret travels in a pipe,
never in argv.

What it guarantees:

- Adoption happens only when the launch is the one the early process
  matches: same argv, same working directory, and an environment that
  differs only in the identity variables. Anything else (a changed
  environment, another interpreter) discards it and launches as usual.
- Nothing is written to disk before adoption: the runner's output goes
  to a pipe until it gets its log path, so the tree's disk checks still
  come before anything is written. What reached the pipe is appended to
  the log at adoption and when the process ends.
- No process is left behind: an early runner that is never adopted (an
  error before the tree runs, a discarded launch) is killed and reaped,
  by `discard` or at interpreter exit (`atexit`). A parent that dies
  closes the pipes, and the runner exits at EOF like any other.

`OMNIGENT_EARLY_RUNNER=0` turns it off.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

from ..config.timeline import mark

IDENTITY_FD_VAR = "OMNIGENT_RUNNER_IDENTITY_FD"
SWITCH_VAR = "OMNIGENT_EARLY_RUNNER"
# what the host adds to a runner's environment at launch (host/launching.py, host/env.py)
IDENTITY_VARS = frozenset({"OMNIGENT_SERVER_URL", "OMNIGENT_RUNNER_ID", "OMNIGENT_RUNNER_TOKEN",
                           "OMNIGENT_TOOL_POLICY"})
_CLIENT_TOKEN_VARS = ("OMNIGENT_SERVER_TOKEN",)  # link.runner_secrets.CLIENT_TOKEN_VARS, without its import


class EarlyRunner:
    """A runner process spawned before the tree, waiting for the identity its first launch gives it."""

    def __init__(self, popen: subprocess.Popen[bytes], identity_w: int, output_r: int,
                 argv: list[str], env: dict[str, str], cwd: str) -> None:
        self.popen = popen
        self._identity_w: int | None = identity_w
        self._output_r: int | None = output_r
        self.argv, self.env, self.cwd = argv, env, cwd
        self.adopted = False

    def adopt(self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None,
              log_path: str | os.PathLike[str]) -> _EarlyHandle | None:
        """Hand the process this launch's identity; None (and discarded) when it is not that launch."""
        if self.adopted or self._identity_w is None:
            return None
        delta = _delta(self.env, dict(env) if env is not None else dict(os.environ))
        if (list(argv) != self.argv or (cwd or os.getcwd()) != self.cwd or delta is None
                or self.popen.poll() is not None):
            self.discard()
            return None
        log_path = os.path.abspath(log_path)
        os.makedirs(os.path.dirname(log_path), mode=0o700, exist_ok=True)
        self._drain(log_path)  # what it said before it knew its log
        message = json.dumps({"env": delta, "log_path": log_path}).encode()
        try:
            os.write(self._identity_w, message)  # far below a pipe's buffer: one write, never blocks
        except OSError:
            self.discard()
            return None
        os.close(self._identity_w)
        self._identity_w = None
        self.adopted = True
        mark("early.adopted")
        return _EarlyHandle(self, log_path)

    def discard(self) -> None:
        """Kill and reap the process unless it was adopted. Idempotent; blocking for milliseconds."""
        if self.adopted:
            return
        self.adopted = True  # never adopted from now on
        if self._identity_w is not None:
            os.close(self._identity_w)
            self._identity_w = None
        if self.popen.returncode is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)  # it was never given anything to finish
            except (ProcessLookupError, PermissionError):
                pass
            self.popen.wait()
        self._close_pipes()

    def _drain(self, log_path: str) -> None:
        if self._output_r is None:
            return
        chunks = []
        while True:
            try:
                chunk = os.read(self._output_r, 65536)
            except BlockingIOError:
                break
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        if chunks:
            fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, b"".join(chunks))
            finally:
                os.close(fd)

    def _close_pipes(self) -> None:
        if self.popen.stdin is not None:
            try:
                self.popen.stdin.close()
            except OSError:
                pass
        if self._output_r is not None:
            os.close(self._output_r)
            self._output_r = None


class _EarlyHandle:
    """The supervisor's `ProcessHandle` over the adopted process (a `subprocess.Popen`)."""

    def __init__(self, early: EarlyRunner, log_path: str) -> None:
        self._early = early
        self._log_path = log_path
        self.pid = early.popen.pid

    async def wait(self) -> int:
        import trio

        popen = self._early.popen
        if popen.returncode is None:
            try:
                pidfd = os.pidfd_open(self.pid)
            except OSError:
                pidfd = None
            try:
                if pidfd is not None:
                    await trio.lowlevel.wait_readable(pidfd)  # readable once the process has exited
                else:
                    while popen.poll() is None:
                        await trio.sleep(0.05)
            finally:
                if pidfd is not None:
                    os.close(pidfd)
            popen.wait()  # exited: reaps at once
        self._early._drain(self._log_path)  # anything written before it reopened its output
        self._early._close_pipes()
        return popen.returncode

    def send_signal_group(self, sig: int) -> None:
        if self._early.popen.returncode is not None:
            return  # reaped: the group id may be someone else's now
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def close_stdin(self) -> None:
        stdin = self._early.popen.stdin
        if stdin is not None and not stdin.closed:
            try:
                stdin.close()
            except OSError:
                pass


class EarlyLauncher:
    """The supervisor's `Launcher`: the first launch adopts the early runner, the rest spawn as usual."""

    def __init__(self, early: EarlyRunner) -> None:
        from supervisor.process import TrioLauncher

        self.early = early
        self._fallback = TrioLauncher()

    async def launch(self, argv: Sequence[str], *, env: Mapping[str, str] | None, cwd: str | None,
                     log_path: str | os.PathLike[str]):
        handle = self.early.adopt(argv, env, cwd, log_path)
        if handle is not None:
            return handle
        return await self._fallback.launch(argv, env=env, cwd=cwd, log_path=log_path)


def start(environ: Mapping[str, str] | None = None) -> EarlyRunner | None:
    """Spawn the runner now; None when turned off or when spawning fails (the host launches then)."""
    environ = os.environ if environ is None else environ
    if environ.get(SWITCH_VAR, "1") == "0":
        return None
    env = {k: v for k, v in environ.items() if k not in _CLIENT_TOKEN_VARS and k not in IDENTITY_VARS}
    # host.launching.runner_argv, without importing the host (trio, protocol): adopt() compares with it
    argv = [env.get("OMNIGENT_RUNNER_PYTHON") or sys.executable, "-m", "omnigent.runner"]
    cwd = os.getcwd()
    identity_r, identity_w = os.pipe()
    output_r, output_w = os.pipe()
    os.set_blocking(output_r, False)
    child_env = {**env, IDENTITY_FD_VAR: str(identity_r)}
    try:
        popen = subprocess.Popen(argv, env=child_env, cwd=cwd, stdin=subprocess.PIPE, stdout=output_w,
                                 stderr=output_w, start_new_session=True, pass_fds=(identity_r,))
    except OSError:
        for fd in (identity_r, identity_w, output_r, output_w):
            os.close(fd)
        return None
    os.close(identity_r)
    os.close(output_w)
    mark("early.spawned")
    early = EarlyRunner(popen, identity_w, output_r, argv, env, cwd)
    _pending.append(early)
    return early


def discard_pending() -> None:
    """Kill and reap every early runner not adopted: the CLI calls it before `os._exit`."""
    while _pending:
        _pending.pop().discard()


_pending: list[EarlyRunner] = []
atexit.register(discard_pending)


def _delta(had: Mapping[str, str], wanted: Mapping[str, str]) -> dict[str, str | None] | None:
    """What to set (None: unset) to turn `had` into `wanted`; None when more than identity differs."""
    delta: dict[str, str | None] = {}
    for key in set(had) | set(wanted):
        if had.get(key) != wanted.get(key):
            if key not in IDENTITY_VARS:
                return None
            delta[key] = wanted.get(key)
    return delta
