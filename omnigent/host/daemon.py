"""`omnigent host --server URL`: the host daemon, a tree of its own under trio.

It holds three things in one nursery: the websocket link to the server
(`ws_link.run_host_link`, authenticated with the host credential, which
reconnects by itself while the runners keep running), the runner pool
(`pool.Host`, launching on `LaunchRunner`), and the local control socket
(`control.py`). It is one per (HOME, server URL): the flock on
`daemons/<key>.lock` is taken first and held until the process ends, so a
second daemon for the same pair leaves at once and a dead one's record is
known stale. Its record and `host.pid` are written only once the control
socket listens, so whoever finds them can talk to it.

Stopping: SIGTERM (or SIGINT, SIGHUP) cancels the tree; every runner gets
TERM, a grace (2 s) and KILL at the same time, and the process is gone well
within 5 s. A daemon started on demand (`--idle-exit S`, what
`omnigent run --server` passes) leaves by itself S seconds after its last
runner ended. The host credential is revoked or unknown (4003): it registers
anew once (a tokenless loopback server allows that), else exits 1 with one line.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

import protocol as p

from ..link.memory import memory_link
from . import control, records
from .env import runner_env
from .pool import DEFAULT_POLICY, Host

log = logging.getLogger("omnigent.host.daemon")

SHUTDOWN_GRACE = 2.0  # per runner, all at once: TERM, this, KILL; the daemon is gone within 5 s


@dataclass
class DaemonConfig:
    server_url: str
    home: Path
    workspace_roots: list[str] = field(default_factory=list)
    idle_exit: float | None = None  # seconds without runners before leaving; None: never
    log_path: Path | None = None
    idle_timeout: float = 3600.0    # an unused runner ends after this long
    # `--permissions`: the most this host's runners' tools may do (HostHello.permissions, and
    # OMNIGENT_TOOL_POLICY in each runner); a session's own mode can only be stricter
    permissions: str = "ask"


class AlreadyRunning(Exception):
    """Another daemon holds the lock for this (HOME, server URL)."""


class DaemonFailed(Exception):
    """The daemon cannot go on: one line for the log and the user."""


async def run_daemon(config: DaemonConfig, *, task_status=trio.TASK_STATUS_IGNORED) -> int:
    """Run the daemon until stopped; returns the exit code. Raises AlreadyRunning before doing anything."""
    paths = records.Paths.of(config.home, config.server_url)
    lock = records.Lock(paths.lock)
    if not lock.try_acquire():
        record = records.read_json(paths.record) or {}
        raise AlreadyRunning(f"a host daemon for {paths.server_url} already runs (pid {record.get('pid', '?')})")
    try:
        return await _Daemon(config, paths).run(task_status)
    finally:
        records.clear_own_files(paths, os.getpid())
        lock.release()


class _Daemon:
    def __init__(self, config: DaemonConfig, paths: records.Paths) -> None:
        self.config = config
        self.paths = paths
        self.server_url = paths.server_url
        self.online = False
        self.exit_code = 0
        server_end, host_end = memory_link()
        self.server_end = server_end
        self.host = Host(
            self.server_url, host_end, log_dir=paths.logs_root, workspace=str(config.home), runners=0,
            env=runner_env(os.environ), policy=DEFAULT_POLICY, shutdown_grace=SHUTDOWN_GRACE,
            workspace_roots=config.workspace_roots, idle_timeout=config.idle_timeout,
            tool_policy=config.permissions,
        )
        self.host_id = ""
        self.started_at = time.time()

    async def run(self, task_status) -> int:
        identity = records.read_identity(self.paths)
        if identity is None:
            identity = await self._register()
        self.host_id, secret = identity
        log.info("host daemon pid %d for %s as %s (protocol %d, permissions %s)", os.getpid(), self.server_url,
                 self.host_id, p.PROTOCOL_VERSION, self.config.permissions)
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            nursery.start_soon(self._signals)
            await nursery.start(self.host.run)
            await nursery.start(control.serve, self.paths.socket, self._control)
            self._write_records()
            nursery.start_soon(self._link, secret)
            if self.config.idle_exit is not None:
                nursery.start_soon(self._idle_exit, self.config.idle_exit)
            task_status.started(self)
        log.info("host daemon pid %d stopped", os.getpid())
        return self.exit_code

    def stop(self, code: int = 0) -> None:
        self.exit_code = self.exit_code or code
        self.nursery.cancel_scope.cancel()

    # --- pieces -----------------------------------------------------------------

    async def _signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as received:
            async for signum in received:
                log.info("%s: stopping the runners and leaving", signal.Signals(signum).name)
                self.stop(0)
                return

    def _hello(self) -> p.HostHello:
        return p.HostHello(host_id=self.host_id, pid=os.getpid(), protocol_version=p.PROTOCOL_VERSION,
                           name=socket.gethostname(), workspace_roots=list(self.host.workspace_roots),
                           runners=self.host.live_runners(), capacity=self.host.capacity,
                           permissions=self.config.permissions)

    async def _link(self, secret: str) -> None:
        from .ws_link import HostRevoked, run_host_link

        registered_again = False
        while True:
            try:
                await run_host_link(self.server_url, self.host_id, secret, self.server_end, self._hello,
                                    task_status=_OnStarted(self._linked))
                return
            except HostRevoked:
                self.online = False
                if registered_again:
                    log.error("the server refuses this host's credential (revoked?): leaving; "
                              "run `omnigent host --server %s` again", self.server_url)
                    self.stop(1)
                    return
                registered_again = True
                log.warning("the server does not know host %s: registering anew", self.host_id)
                try:
                    self.host_id, secret = await self._register()
                except DaemonFailed as exc:
                    log.error("%s", exc)
                    self.stop(1)
                    return
                self._write_records()

    def _linked(self, ack: Any) -> None:
        self.online = True
        log.info("connected to %s (generation %s)", self.server_url, getattr(ack, "generation", "?"))

    async def _register(self) -> tuple[str, str]:
        from .daemon_client import RegisterError, register_host

        try:
            host_id, secret = await register_host(self.server_url, token=None,
                                                  workspace_roots=self.config.workspace_roots)
        except RegisterError as exc:
            raise DaemonFailed(str(exc)) from None
        records.write_identity(self.paths, host_id, secret)
        return host_id, secret

    async def _idle_exit(self, after: float) -> None:
        while True:
            if self.host.live_runners():
                await trio.sleep(min(after, 30.0))
                continue
            since = self.host.idle_since if self.host.idle_since is not None else trio.current_time()
            left = since + after - trio.current_time()
            if left <= 0:
                log.info("no runner for %.0f s: leaving", after)
                self.stop(0)
                return
            await trio.sleep(min(left, 30.0))

    def _write_records(self) -> None:
        record = {"pid": os.getpid(), "server_url": self.server_url, "host_id": self.host_id,
                  "control_socket": str(self.paths.socket), "protocol_version": p.PROTOCOL_VERSION,
                  "started_at": self.started_at, "permissions": self.config.permissions,
                  "log_path": str(self.config.log_path) if self.config.log_path else None}
        records.write_private(self.paths.record, json.dumps(record) + "\n")
        records.write_pid_file(self.paths, os.getpid())

    async def _control(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request["op"]
        if op == "hello":
            return {"ok": True, "host_id": self.host_id, "pid": os.getpid(),
                    "protocol_version": p.PROTOCOL_VERSION, "online": self.online,
                    "permissions": self.config.permissions}
        if op == "allow_workspace":
            workspace = request.get("workspace")
            if not isinstance(workspace, str) or not os.path.isabs(workspace) or not os.path.isdir(workspace):
                raise control.ControlError(f"not an absolute directory: {workspace!r}")
            log.info("workspace allowed: %s", self.host.allow_workspace(workspace))
            return {"ok": True}
        if op == "session_env":
            session_id, env = request.get("session_id"), request.get("env")
            if not isinstance(session_id, str) or not isinstance(env, dict):
                raise control.ControlError("session_env needs a 'session_id' and an 'env' object")
            self.host.set_session_env(session_id, env)
            return {"ok": True}
        if op == "session_runner":  # is a runner kept for this session (alive, or being replaced)?
            session_id = request.get("session_id")
            if not isinstance(session_id, str):
                raise control.ControlError("session_runner needs a 'session_id'")
            return {"ok": True, "kept": self.host.serves_session(session_id)}
        if op == "status":
            return {"ok": True, "host_id": self.host_id, "pid": os.getpid(), "server_url": self.server_url,
                    "online": self.online, "runners": self.host.live_runners(),
                    "workspace_roots": self.host.workspace_roots, "allowed": sorted(self.host.allowed),
                    "started_at": self.started_at, "permissions": self.config.permissions,
                    "log_path": str(self.config.log_path) if self.config.log_path else None}
        raise control.ControlError(f"unknown op {op!r}")


class _OnStarted:
    """A task_status for `run_host_link` that calls back on every ack it reports (the first one)."""

    def __init__(self, callback) -> None:
        self.callback = callback

    def started(self, value: Any = None) -> None:
        self.callback(value)


# --- the process ------------------------------------------------------------------


def open_daemon_log(paths: records.Paths, given: Path | None) -> tuple[Path, logging.Handler]:
    """The log this process writes: `given` (the detaching parent already points stderr at it) or a fresh
    `logs/host-daemon/daemon-<stamp>.log`. Every record is flushed as it is written (the seeds grep it)."""
    from ..config.dirs import private_dir, private_file

    if given is None:
        private_dir(paths.log_dir, "cannot create log folder")
        given = paths.log_dir / f"daemon-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    private_file(given)
    handler = logging.FileHandler(given, encoding="utf-8")  # StreamHandler flushes every record
    handler.setFormatter(logging.Formatter("%(asctime)s [%(name)s] %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return given, handler


def main(config: DaemonConfig, *, foreground_echo: bool) -> int:
    """The daemon process: log, run under trio, exit code. `foreground_echo` also logs to stderr."""
    paths = records.Paths.of(config.home, config.server_url)
    config.log_path, handler = open_daemon_log(paths, config.log_path)
    if foreground_echo:
        echo = logging.StreamHandler(sys.stderr)
        echo.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logging.getLogger().addHandler(echo)
    try:
        return trio.run(run_daemon, config)
    except AlreadyRunning as exc:
        log.info("%s", exc)
        print(f"Error: {exc}", file=sys.stderr, flush=True)
        return 1
    except DaemonFailed as exc:
        log.error("%s", exc)
        print(f"Error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        handler.flush()
