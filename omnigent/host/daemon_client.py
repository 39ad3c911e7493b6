"""The CLI's side of the host daemon: find it, start it, stop it, talk to it.

`ensure_daemon` is what `omnigent run --server` calls first. Under the start
lock (so concurrent starts are serialized and the second one reuses the
first's daemon) it reuses the daemon whose liveness lock is held and which
answers `hello` with this CLI's protocol version; a daemon of another
version is stopped (SIGTERM, then SIGKILL) and replaced; a record without a
held lock is stale and simply overwritten: its pid is never signalled. A new
daemon is registered with the server first when this HOME has no identity
for it (the client token is used for that, here, and never handed on), then
spawned detached: its own session, stdin from /dev/null, stdout and stderr
into its log file, cwd `~/.omnigent`, and an environment without the client
token. It is ready when its record names it and its control socket answers.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

import protocol as p

from . import control, records
from .env import REMOTE_AUTH_VAR

START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
DEFAULT_IDLE_EXIT = 3600.0


class DaemonError(Exception):
    """The daemon could not be started, reached or stopped: one line for the user."""


class RegisterError(DaemonError):
    """`POST /v1/hosts` failed."""


@dataclass
class DaemonInfo:
    """A daemon that answered `hello` with this CLI's protocol version."""

    host_id: str
    pid: int
    control_socket: Path
    protocol_version: int
    online: bool = False
    permissions: str = "ask"  # its `--permissions` (a daemon older than issue 9 says nothing: ask)

    async def allow_workspace(self, directory: str | os.PathLike) -> None:
        await self._ask({"op": "allow_workspace", "workspace": str(directory)})

    async def session_env(self, session_id: str, env: dict[str, str]) -> None:
        await self._ask({"op": "session_env", "session_id": session_id, "env": env})

    async def keeps_runner_for(self, session_id: str) -> bool:
        """Whether the daemon keeps a runner for that session (alive, or its replacement on the way)."""
        return bool((await self._ask({"op": "session_runner", "session_id": session_id})).get("kept"))

    async def status(self) -> dict[str, Any]:
        return await self._ask({"op": "status"})

    async def wait_online(self, timeout: float = START_TIMEOUT) -> bool:
        """Until the daemon's link to the server is up (its first ack); False after `timeout`."""
        with trio.move_on_after(timeout):
            while True:
                answer = await self._ask({"op": "hello"})
                if answer.get("online"):
                    self.online = True
                    self.host_id = str(answer.get("host_id") or self.host_id)  # re-registered meanwhile?
                    return True
                await trio.sleep(0.05)
        return False

    async def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            return await control.request(self.control_socket, request)
        except control.ControlError as exc:
            raise DaemonError(str(exc)) from None


async def register_host(server_url: str, *, token: str | None, workspace_roots: Iterable[str] = ()
                        ) -> tuple[str, str]:
    """`POST /v1/hosts` through the SDK (`client.hosts.register`): a fresh (host_id, host_secret)."""
    from ..client import APIConnectionError, APIStatusError, OmnigentClient, OmnigentError

    roots = [os.path.realpath(r) for r in workspace_roots]
    try:
        async with OmnigentClient(server_url, token=token, timeout=30.0) as client:
            credential = await client.hosts.register(name=socket.gethostname(), workspace_roots=roots or None)
    except APIStatusError as exc:
        raise RegisterError(f"{server_url} refused to register this host ({exc.status_code}): {exc}") from None
    except APIConnectionError as exc:  # its message names the server
        raise RegisterError(f"cannot register this host: {exc}") from None
    except OmnigentError as exc:  # an answer that is not the API's
        raise RegisterError(f"cannot register this host with {server_url}: {exc}") from None
    return credential.host_id, credential.host_secret


async def ensure_daemon(server_url: str, *, home: Path, token: str | None,
                        workspace_roots: Iterable[str] = (), idle_exit: float | None = DEFAULT_IDLE_EXIT,
                        permissions: str = "ask") -> DaemonInfo:
    """The daemon for (home, server_url), reused or started; see the module doc."""
    paths = records.Paths.of(home, server_url)
    start_lock = records.Lock(paths.start_lock)
    await _acquire(start_lock)
    try:
        info = await find_daemon(paths)
        if info is not None and info.protocol_version != p.PROTOCOL_VERSION:
            print(f"Stopping host daemon pid {info.pid}: it speaks protocol {info.protocol_version}, "
                  f"this omnigent {p.PROTOCOL_VERSION}", file=sys.stderr, flush=True)
            await stop_daemon(paths)
            info = None
        if info is not None:
            return info
        if records.read_identity(paths) is None:
            host_id, secret = await register_host(paths.server_url, token=token, workspace_roots=workspace_roots)
            records.write_identity(paths, host_id, secret)
        proc, log_path = spawn_daemon(paths, workspace_roots=workspace_roots, idle_exit=idle_exit,
                                      permissions=permissions)
        return await _wait_started(paths, proc, log_path)
    finally:
        start_lock.release()


async def find_daemon(paths: records.Paths, *, settle: float = 10.0) -> DaemonInfo | None:
    """The live daemon for `paths` (whatever its protocol version), or None.

    A held lock with no answer yet is a daemon still starting (its record is
    written once its socket listens): it gets `settle` seconds.
    """
    with trio.move_on_after(settle):
        while records.lock_held(paths.lock):
            record = records.read_json(paths.record)
            if record is not None:
                try:
                    answer = await control.request(Path(record.get("control_socket") or paths.socket),
                                                   {"op": "hello"}, timeout=2.0)
                except control.ControlError:
                    answer = None
                if answer is not None:
                    return DaemonInfo(host_id=str(answer.get("host_id")), pid=int(answer.get("pid", 0)),
                                      control_socket=Path(record.get("control_socket") or paths.socket),
                                      protocol_version=int(answer.get("protocol_version", -1)),
                                      online=bool(answer.get("online")),
                                      permissions=str(answer.get("permissions") or "ask"))
            await trio.sleep(0.05)
        return None
    raise DaemonError(f"the host daemon for {paths.server_url} holds its lock but does not answer on "
                      f"{paths.socket}; stop it with `omnigent host stop --server {paths.server_url}`")


def spawn_daemon(paths: records.Paths, *, workspace_roots: Iterable[str] = (),
                 idle_exit: float | None = None, permissions: str = "ask") -> tuple[subprocess.Popen[bytes], Path]:
    """Start `omnigent host` detached (see module doc); returns the process and its log path."""
    from ..config.dirs import private_dir

    private_dir(paths.log_dir, "cannot create log folder")
    log_path = paths.log_dir / f"daemon-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    argv = [sys.executable, "-m", "omnigent", "host", "--server", paths.server_url, "--log-file", str(log_path)]
    for root in workspace_roots:
        argv += ["--workspace-root", os.path.realpath(root)]
    if idle_exit is not None:
        argv += ["--idle-exit", f"{idle_exit:g}"]
    argv += ["--permissions", permissions]
    env = {k: v for k, v in os.environ.items() if k != REMOTE_AUTH_VAR}
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, env=env,
                                cwd=str(paths.root), start_new_session=True, close_fds=True)
    except OSError as exc:
        raise DaemonError(f"cannot start the host daemon: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return proc, log_path


async def _wait_started(paths: records.Paths, proc: subprocess.Popen[bytes], log_path: Path) -> DaemonInfo:
    with trio.move_on_after(START_TIMEOUT):
        while True:
            code = proc.poll()
            if code is not None:
                info = await find_daemon(paths, settle=2.0)  # one started by hand meanwhile won the lock
                if info is not None:
                    return info
                raise DaemonError(f"the host daemon exited at start ({code}): {_last_line(log_path)} "
                                  f"(log: {log_path})")
            record = records.read_json(paths.record)
            if record is not None and record.get("pid") == proc.pid:
                info = await find_daemon(paths, settle=2.0)
                if info is not None and info.pid == proc.pid:
                    return info
            await trio.sleep(0.05)
    raise DaemonError(f"the host daemon did not start within {START_TIMEOUT:g} s (log: {log_path})")


async def stop_daemon(paths: records.Paths) -> int | None:
    """Stop the live daemon for `paths` (TERM, then KILL after STOP_TIMEOUT); its pid, or None if none ran.

    Only a daemon whose lock is held is signalled: a stale record's pid may be anyone's.
    """
    record = records.live_record(paths)
    if record is None or not isinstance(record.get("pid"), int):
        return None
    pid = record["pid"]
    for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return pid
        with trio.move_on_after(wait):
            while records.lock_held(paths.lock):
                await trio.sleep(0.05)
            return pid
    raise DaemonError(f"the host daemon pid {pid} did not stop")


def live_daemons(home: Path) -> list[dict[str, Any]]:
    """The records of every live daemon of this HOME (any server)."""
    folder = Path(home) / ".omnigent" / "daemons"
    found = []
    for path in sorted(folder.glob("*.json")):
        record = records.read_json(path)
        if record and isinstance(record.get("server_url"), str):
            if records.lock_held(path.with_suffix(".lock")):
                found.append(record)
    return found


async def _acquire(lock: records.Lock, timeout: float = START_TIMEOUT + 15) -> None:
    with trio.move_on_after(timeout):
        while not lock.try_acquire():
            await trio.sleep(0.05)
        return
    raise DaemonError(f"another omnigent has been starting the host daemon for over {timeout:g} s "
                      f"({lock.path})")


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1].strip() if lines else "no output"
