"""On-demand runners (the host daemon): one runner per session, in a workspace this host allowed.

Besides the fixed slots, a `LaunchRunner` frame starts one runner for a
session in a workspace the host's own user allowed (`--workspace-root`
roots, or directories its local clients registered); anything else is
answered `workspace_not_allowed`. Each such runner has a supervisor of its
own under the same policy, so one session's runner that cannot stay up
gives up alone, and shutdown stops all of them at once (each TERM, grace,
KILL) instead of one after another. A crash is repaired like a slot's: a
replacement with a new id (the server rebinds the session). A runner nobody
uses (its log has not grown for `idle_timeout`: runners log every turn) is
stopped and not replaced.

`OnDemand` is a layer of `pool.Host`, over `launching.RunnerLaunches`.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

import protocol as p
from supervisor import GaveUp, ProcessConfig, RestartPolicy, Supervisor, process_child

from .env import clean_session_env, passthrough_names
from .launching import RunnerLaunches

log = logging.getLogger("omnigent.host")

IDLE_CHECK = 60.0  # at most this long between two looks at an on-demand runner's activity


@dataclass(eq=False)
class Launch:
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


def default_activity(launch: Launch) -> object:
    """What changes when a runner is used: its log grows on every turn."""
    try:
        size = os.stat(launch.log_path).st_size if launch.log_path is not None else None
    except OSError:
        size = None
    return (launch.runner_id, size)


class OnDemand(RunnerLaunches):
    """Launching, watching and retiring the runners of sessions (`LaunchRunner`)."""

    workspace_roots: list[str]
    allowed: set[str]
    capacity: int
    idle_timeout: float | None
    activity: Callable[[Launch], object]
    policy: RestartPolicy
    startup_timeout: float
    shutdown_grace: float
    launcher: Any
    _launches: dict[str, Launch]
    _numbers: itertools.count[int]
    _nursery: trio.Nursery | None

    def allow_workspace(self, directory: str) -> str:
        """Let runners start in `directory` (and below it) from now on; returns it resolved."""
        real = real_path(directory)
        self.allowed.add(real)
        return real

    def set_session_env(self, session_id: str, env: Mapping[str, str]) -> None:
        """The model endpoint/key for that session's runners (kept in memory only)."""
        self._session_env[session_id] = clean_session_env(env, passthrough_names(self.env))

    def serves_session(self, session_id: str) -> bool:
        """Whether an on-demand runner of this host is kept for that session (running or being replaced)."""
        return any(launch.session_id == session_id for launch in self._launches.values())

    def check_workspace(self, workspace: str | None) -> tuple[str | None, str, str]:
        """(resolved dir, error code, message); the code is "" when the launch may go ahead."""
        if not workspace:
            if self.workspace_roots:
                workspace = self.workspace_roots[0]
            else:
                return None, "workspace_not_allowed", "no workspace given, and this host has no workspace root"
        if not os.path.isabs(workspace):
            return None, "workspace_not_allowed", f"workspace must be an absolute path: {workspace}"
        real = real_path(workspace)
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
        launch = Launch(slot=f"session-{next(self._numbers)}", session_id=frame.session_id, workspace=workspace)
        self._launches[launch.slot] = launch
        assert self._nursery is not None
        self._nursery.start_soon(self._supervise, launch)
        await launch.launched.wait()
        if launch.runner_id is not None and not launch.error:
            answer(runner_id=launch.runner_id)
        else:
            answer(error_code="launch_failed", message=launch.error or "the runner did not start")

    async def _supervise(self, launch: Launch) -> None:
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
            exc = first_gave_up(group)
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

    async def _idle_watch(self, launch: Launch) -> None:
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


def first_gave_up(group: BaseExceptionGroup[GaveUp]) -> GaveUp:
    """The first `GaveUp` of an `except*` group (nested groups flattened)."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    assert isinstance(exc, GaveUp)
    return exc


def real_path(path: str) -> str:
    return os.path.realpath(os.path.expanduser(path))


def _within(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip(os.sep) + os.sep)
