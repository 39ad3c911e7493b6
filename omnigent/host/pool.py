"""A pool of runner child processes kept alive by a `supervisor.Supervisor`.

Each pool slot is a permanent process child. Every (re)start gets a fresh
`runner_<hex>` id, so a replacement is never confused with the runner it
replaces. A runner counts as started only once the server has seen its hello
(the server says so over the link); the host tells the server when a runner
process starts and ends, with the exit code or signal and its log tail.

Credentials: each launch mints a fresh secret for its runner id. The secret
goes only into that runner's environment (`OMNIGENT_RUNNER_TOKEN`); the
server is told its hash in a `RunnerCredential` frame posted *before* the
process is launched. Links keep order but the server reads them on its own
time, so a runner can still dial first: the server waits a bounded time for
the credential of an id it does not know yet (`runner_link.serve_runner`).
The host never hands a runner its own or a client's credentials.

On demand (the host daemon): besides the fixed slots, a `LaunchRunner` frame
starts one runner for a session in a workspace the host's own user allowed
(`--workspace-root` roots, or directories its local clients registered);
anything else is answered `workspace_not_allowed`. Each such runner has a
supervisor of its own under the same policy, so one session's runner that
cannot stay up gives up alone, and shutdown stops all of them at once (each
TERM, grace, KILL) instead of one after another. A crash is repaired like a
slot's: a replacement with a new id (the server rebinds the session). A
runner nobody uses (its log has not grown for `idle_timeout`: runners log
every turn) is stopped and not replaced.

Spares (the REPL's warm spare): `spares` more slots, added with
`Supervisor.start_child` only once the fixed slots are online *and*
`release_spares()` was called. A spare starting with the first runner would
import openai while that runner serves the first turn, which on 2 cores
delays the first answer; the REPL releases it once that turn is done or it
waits at a terminal prompt. From then on a spare slot is a slot like any
other: permanent, restarted by the same policy.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

import protocol as p
from supervisor import (
    ChildExited,
    ChildSpec,
    GaveUp,
    ProcessConfig,
    RestartPolicy,
    Supervisor,
    describe_returncode,
    process_child,
    read_log_tail,
)

from ..config.timeline import mark
from ..link.memory import LinkEnd
from ..link.runner_secrets import CLIENT_TOKEN_VARS, ENV_VAR, hash_secret, mint_secret
from ..tools import reaper
from .env import TOOL_POLICY_VAR, clean_session_env, passthrough_names

log = logging.getLogger("omnigent.host")

DEFAULT_POLICY = RestartPolicy(base=0.05, factor=2.0, cap=5.0, jitter=0.1, reset_after=30.0,
                               intensity=5, period=30.0)


IDLE_CHECK = 60.0  # at most this long between two looks at an on-demand runner's activity


@dataclass(eq=False)
class _Launch:
    """One on-demand runner slot: a session's runner and the replacements of it."""

    slot: str
    session_id: str | None
    workspace: str
    runner_id: str | None = None       # the current attempt's id, None between attempts
    log_path: Path | None = None
    error: str = ""
    launched: trio.Event = field(default_factory=trio.Event)  # first attempt launched, or given up
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    supervisor: Supervisor | None = None

    def kill(self, reason: str) -> None:
        if self.supervisor is not None:
            self.supervisor.kill_child(self.slot, reason)


def _default_activity(launch: _Launch) -> object:
    """What changes when a runner is used: its log grows on every turn."""
    try:
        size = os.stat(launch.log_path).st_size if launch.log_path is not None else None
    except OSError:
        size = None
    return (launch.runner_id, size)


def runner_argv(environ: Mapping[str, str] = os.environ) -> list[str]:
    """`OMNIGENT_RUNNER_PYTHON` picks another interpreter (a venv, a wrapper) for runners."""
    return [environ.get("OMNIGENT_RUNNER_PYTHON") or sys.executable, "-m", "omnigent.runner"]


class Host:
    def __init__(
        self,
        server_url: str,
        link: LinkEnd,
        *,
        log_dir: Path,
        workspace: str,
        runners: int = 1,
        env: Mapping[str, str] | None = None,
        policy: RestartPolicy = DEFAULT_POLICY,
        startup_timeout: float = 20.0,
        shutdown_grace: float = 2.0,
        launcher=None,
        workspace_roots: Iterable[str] = (),
        capacity: int = 0,
        idle_timeout: float | None = None,
        activity: Callable[[_Launch], object] = _default_activity,
        on_demand_log_dir: str = "host-runner",
        spares: int = 0,
        tool_policy: str = "ask",
    ) -> None:
        self.server_url = server_url
        self.tool_policy = tool_policy  # OMNIGENT_TOOL_POLICY of every runner (host/env.py)
        self.link = link
        self.log_dir = Path(log_dir)
        self.workspace = workspace
        self.count = runners
        self.spares = spares
        self._spares_released = trio.Event()
        self._slots_online = trio.Event()     # the fixed slots are all online
        self.env = {k: v for k, v in (os.environ if env is None else env).items() if k not in CLIENT_TOKEN_VARS}
        self.policy = policy
        self.startup_timeout = startup_timeout
        self.shutdown_grace = shutdown_grace
        self.launcher = launcher
        self.supervisor = Supervisor(policy, name="host")
        self._online: dict[str, trio.Event] = {}
        self._pids: dict[str, int] = {}       # runner id -> pid, while its process lives
        self._slot_of: dict[str, str] = {}   # runner id -> slot name
        self.first_launch = trio.Event()      # lets the caller overlap its own start-up with ours
        # on demand (the daemon)
        self.workspace_roots = [_real(r) for r in workspace_roots]
        self.allowed: set[str] = set()        # directories local clients registered
        self.capacity = capacity
        self.idle_timeout = idle_timeout
        self.activity = activity
        self.on_demand_log_dir = on_demand_log_dir
        self._session_env: dict[str, dict[str, str]] = {}
        self._launches: dict[str, _Launch] = {}
        self._numbers = itertools.count(1)
        self._nursery: trio.Nursery | None = None
        self.idle_since: float | None = None  # when the last runner ended (set by run)

    # --- what the supervisor calls ------------------------------------------

    def _prepare(self, slot: str, launch: _Launch | None = None) -> ProcessConfig:
        runner_id = f"runner_{uuid.uuid4().hex}"
        self._online[runner_id] = trio.Event()
        self._slot_of[runner_id] = slot
        secret = mint_secret()
        self.link.post(p.RunnerCredential(runner_id=runner_id, secret_hash=hash_secret(secret)))
        env = dict(self.env)
        folder, workspace = "runner", self.workspace
        if launch is not None:
            env.update(self._session_env.get(launch.session_id or "", {}))
            folder, workspace = self.on_demand_log_dir, launch.workspace
        for name in CLIENT_TOKEN_VARS:
            env.pop(name, None)
        env.update({"OMNIGENT_SERVER_URL": self.server_url, "OMNIGENT_RUNNER_ID": runner_id, ENV_VAR: secret,
                    TOOL_POLICY_VAR: self.tool_policy})  # last: no inherited or session value wins
        log_path = self.log_dir / folder / f"{runner_id}.log"
        if launch is not None:
            launch.runner_id, launch.log_path = runner_id, log_path
        return ProcessConfig(argv=runner_argv(self.env), env=env, cwd=workspace,
                             log_path=log_path, label=runner_id)

    async def _ready(self, config: ProcessConfig, _handle) -> None:
        await self._online[config.label].wait()

    def _launched(self, config: ProcessConfig, handle) -> None:
        # the seeds grep this exact line for the runner's own pid: keep its wording
        log.info("Launched runner %s for workspace %s (pid=%d)", config.label, config.cwd, handle.pid)
        mark("runner.spawned")
        self.first_launch.set()
        self._pids[config.label] = handle.pid
        self.link.post(p.RunnerLaunched(runner_id=config.label, pid=handle.pid, log_path=str(config.log_path)))

    def _exited(self, config: ProcessConfig, _handle, returncode: int) -> None:
        runner_id = config.label
        self._online.pop(runner_id, None)
        self._slot_of.pop(runner_id, None)
        self._pids.pop(runner_id, None)
        self._sweep_tools()
        if not self._online:
            self.idle_since = trio.current_time()
        reason = describe_returncode(returncode)
        log.info("runner %s %s", runner_id, reason)
        self.link.post(p.RunnerExited(
            runner_id=runner_id, code=returncode if returncode >= 0 else None,
            signal=-returncode if returncode < 0 else None, reason=reason,
            log_tail=read_log_tail(config.log_path, lines=20) if returncode else "",
        ))

    def _sweep_tools(self) -> None:
        """Kill what the tools of a runner that ended left behind (they are ours: we are a subreaper).

        Only processes marked as a tool's whose runner is gone: this process may
        have children of its own (the local tree's, a test's). Blocking, bounded
        (`reaper.sweep_orphans`); nothing to do costs one read of /proc.
        """
        live = set(self._pids.values())
        swept = reaper.sweep_orphans(keep=live, select=reaper.orphaned_tools(alive=live))
        if swept:
            log.info("killed %d leftover tool process(es) of ended runners: %s", len(swept), swept)

    def specs(self) -> list[ChildSpec]:
        """The fixed slots, `runner-0` ... (spares, if any, are numbered after them)."""
        return [self._slot_spec(f"runner-{i}") for i in range(self.count)]

    def _slot_spec(self, slot: str) -> ChildSpec:
        return process_child(
            slot, lambda: self._prepare(slot), ready=self._ready, launcher=self.launcher,
            startup_timeout=self.startup_timeout, shutdown_grace=self.shutdown_grace,
            on_launched=self._launched, on_exit=self._exited,
        )

    def release_spares(self) -> None:
        """Let the spare slots start (once the fixed ones are online). Idempotent; any task or time."""
        self._spares_released.set()

    async def _start_spares(self) -> None:
        await self._slots_online.wait()
        await self._spares_released.wait()
        for i in range(self.count, self.count + self.spares):
            try:
                await self.supervisor.start_child(self._slot_spec(f"runner-{i}"))
            except (GaveUp, ChildExited, RuntimeError):
                return  # gave up (run raises it too), or the pool is stopping

    # --- running --------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Host] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the pool until cancelled; started once every runner is online.

        When a runner cannot stay up (restart intensity exceeded) the server is
        told why and the pool ends without taking the rest of the tree down:
        the server turns that into a clear error for whoever waits on a turn.
        """
        self.idle_since = trio.current_time()
        async with _subreaper(), trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._serve_link)
            if self.spares:
                nursery.start_soon(self._start_spares)
            try:
                await self.supervisor.run(self.specs(), task_status=_Relay(task_status, self._slots_online, self))
            except* GaveUp as group:
                self._gave_up(_first(group))
            nursery.cancel_scope.cancel()

    def _gave_up(self, exc: GaveUp) -> None:
        log.error("giving up on runners: %s", exc)
        self.link.post(p.RunnerExited(runner_id="", code=None, signal=None, reason=exc.reason,
                                      log_tail=exc.log_tail, gave_up=True))

    async def _serve_link(self) -> None:
        async for frame in self.link.receive:
            if isinstance(frame, p.RunnerOnline):
                event = self._online.get(frame.runner_id)
                if event is not None:
                    event.set()
            elif isinstance(frame, p.KillRunner):
                slot = self._slot_of.get(frame.runner_id)
                launch = self._launches.get(slot) if slot is not None else None
                if launch is not None:
                    log.warning("killing runner %s: %s", frame.runner_id, frame.reason)
                    launch.kill(frame.reason)
                elif slot is not None:
                    log.warning("killing runner %s: %s", frame.runner_id, frame.reason)
                    self.supervisor.kill_child(slot, frame.reason)
            elif isinstance(frame, p.LaunchRunner):
                assert self._nursery is not None
                self._nursery.start_soon(self.launch, frame)

    # --- on demand -------------------------------------------------------------

    def allow_workspace(self, directory: str) -> str:
        """Let runners start in `directory` (and below it) from now on; returns it resolved."""
        real = _real(directory)
        self.allowed.add(real)
        return real

    def set_session_env(self, session_id: str, env: Mapping[str, str]) -> None:
        """The model endpoint/key for that session's runners (kept in memory only)."""
        self._session_env[session_id] = clean_session_env(env, passthrough_names(self.env))

    def serves_session(self, session_id: str) -> bool:
        """Whether an on-demand runner of this host is kept for that session (running or being replaced)."""
        return any(launch.session_id == session_id for launch in self._launches.values())

    def live_runners(self) -> list[str]:
        """Ids of the runner processes alive now (fixed slots and on demand)."""
        return list(self._online)

    def check_workspace(self, workspace: str | None) -> tuple[str | None, str, str]:
        """(resolved dir, error code, message); the code is "" when the launch may go ahead."""
        if not workspace:
            if self.workspace_roots:
                workspace = self.workspace_roots[0]
            else:
                return None, "workspace_not_allowed", "no workspace given, and this host has no workspace root"
        if not os.path.isabs(workspace):
            return None, "workspace_not_allowed", f"workspace must be an absolute path: {workspace}"
        real = _real(workspace)
        if not any(_within(real, base) for base in (*self.workspace_roots, *self.allowed)):
            return None, "workspace_not_allowed", (
                f"workspace {workspace} is not allowed on this host (allow it with "
                "`omnigent host --workspace-root DIR`, or run `omnigent run --server` there)")
        if not os.path.isdir(real):
            return None, "launch_failed", f"workspace {workspace} is not a directory"
        return real, "", ""

    async def launch(self, frame: p.LaunchRunner) -> None:
        """Answer one `LaunchRunner`: a `LaunchResult` after the runner's credential and launch frames."""
        def answer(**fields: Any) -> None:
            self.link.post(p.LaunchResult(request_id=frame.request_id, **fields))

        workspace, code, message = self.check_workspace(frame.workspace)
        if code:
            log.warning("refused to launch a runner for session %s: %s", frame.session_id, message)
            answer(error_code=code, message=message)
            return
        assert workspace is not None
        if self.capacity and len(self._launches) >= self.capacity:
            answer(error_code="at_capacity", message=f"this host runs at most {self.capacity} runner(s)")
            return
        launch = _Launch(slot=f"session-{next(self._numbers)}", session_id=frame.session_id, workspace=workspace)
        self._launches[launch.slot] = launch
        assert self._nursery is not None
        self._nursery.start_soon(self._supervise, launch)
        await launch.launched.wait()
        if launch.runner_id is not None and not launch.error:
            answer(runner_id=launch.runner_id)
        else:
            answer(error_code="launch_failed", message=launch.error or "the runner did not start")

    async def _supervise(self, launch: _Launch) -> None:
        def launched(config: ProcessConfig, handle) -> None:
            self._launched(config, handle)
            launch.launched.set()

        spec = process_child(
            launch.slot, lambda: self._prepare(launch.slot, launch), ready=self._ready, launcher=self.launcher,
            startup_timeout=self.startup_timeout, shutdown_grace=self.shutdown_grace,
            on_launched=launched, on_exit=self._exited,
        )
        launch.supervisor = Supervisor(self.policy, name=f"host/{launch.slot}")
        try:
            with launch.scope:
                async with trio.open_nursery() as nursery:
                    if self.idle_timeout is not None:
                        nursery.start_soon(self._idle_watch, launch)
                    await launch.supervisor.run([spec])
        except* GaveUp as group:
            exc = _first(group)
            launch.error = f"{exc.reason}" + (f"\n{exc.log_tail}" if exc.log_tail else "")
            log.error("giving up on the runner of session %s: %s", launch.session_id, exc.reason)
        except* Exception as group:  # e.g. the runner could not be spawned at all
            launch.error = f"cannot launch a runner: {group.exceptions[0]}"
            log.error("%s", launch.error)
        finally:
            self._launches.pop(launch.slot, None)
            launch.launched.set()
            if not self._online:
                self.idle_since = trio.current_time()

    async def _idle_watch(self, launch: _Launch) -> None:
        """Stop the runner of `launch` for good once nobody used it for `idle_timeout`."""
        assert self.idle_timeout is not None
        seen, active_at = self.activity(launch), trio.current_time()
        while True:
            await trio.sleep(min(self.idle_timeout / 4, IDLE_CHECK))
            now, mark = trio.current_time(), self.activity(launch)
            online = self._online.get(launch.runner_id or "")
            if mark != seen or online is None or not online.is_set():  # a start is not idleness
                seen, active_at = mark, now
            elif now - active_at >= self.idle_timeout:
                log.info("runner %s unused for %.0f s: stopping it", launch.runner_id, now - active_at)
                launch.scope.cancel()
                return


_subreaper_pools = 0  # pools running in this process: the subreaper flag is process-wide


@contextlib.asynccontextmanager
async def _subreaper() -> AsyncIterator[None]:
    """This process is a subreaper while a pool runs in it, so a killed runner's orphaned tool
    processes come to us to be swept (see `omnigent.tools.reaper`); cleared after the last
    pool stopped its runners, so a process that hosted a pool for a while (a test) does not
    go on collecting other processes' orphans."""
    global _subreaper_pools
    if _subreaper_pools == 0:
        reaper.become_subreaper()
    _subreaper_pools += 1
    try:
        yield
    finally:
        _subreaper_pools -= 1
        if _subreaper_pools == 0:
            reaper.become_subreaper(False)


class _Relay:
    """The supervisor's task status: reports `host` started (as `Host.run` declares, not the
    supervisor the supervisor reports) and sets `event`."""

    def __init__(self, status: trio.TaskStatus[Host], event: trio.Event, host: Host) -> None:
        self._status, self._event, self._host = status, event, host

    def started(self, value: object = None) -> None:
        self._status.started(self._host)
        self._event.set()


def _first(group: BaseExceptionGroup[GaveUp]) -> GaveUp:
    """The first `GaveUp` of an `except*` group (nested groups flattened)."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    assert isinstance(exc, GaveUp)
    return exc


def _real(path: str) -> str:
    return os.path.realpath(os.path.expanduser(path))


def _within(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip(os.sep) + os.sep)
