"""A pool of runner child processes kept alive by a `supervisor.Supervisor`.

Each pool slot is a permanent process child; how a runner is launched, and
what happens when it ends, is `launching.py`'s, the same for every runner.
The pool runs the slots under its supervisor, serves its link to the server
(a runner online, a runner to kill, a runner to launch) and, in the host
daemon, launches runners on demand (`on_demand.py`). While it runs, its
process is a child subreaper (`subreaper.py`).

Spares (the REPL's warm spare): `spares` more slots, added with
`Supervisor.start_child` only once the fixed slots are online *and*
`release_spares()` was called. A spare starting with the first runner would
import openai while that runner serves the first turn, which on 2 cores
delays the first answer; the REPL releases it once that turn is done or it
waits at a terminal prompt. From then on a spare slot is a slot like any
other: permanent, restarted by the same policy.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import trio

import protocol as p
from supervisor import ChildExited, ChildSpec, GaveUp, RestartPolicy, Supervisor, process_child

from ..link.memory import LinkEnd
from ..link.runner_secrets import CLIENT_TOKEN_VARS
from .on_demand import Launch, OnDemand, default_activity, first_gave_up, real_path
from .subreaper import subreaper

log = logging.getLogger("omnigent.host")

DEFAULT_POLICY = RestartPolicy(base=0.05, factor=2.0, cap=5.0, jitter=0.1, reset_after=30.0,
                               intensity=5, period=30.0)


class Host(OnDemand):
    """The pool: its fixed slots and spares, its link to the server, and its on-demand runners."""

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
        activity: Callable[[Launch], object] = default_activity,
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
        self._online = {}
        self._pids = {}  # runner id -> pid, while its process lives
        self._slot_of = {}  # runner id -> slot name
        self.first_launch = trio.Event()      # lets the caller overlap its own start-up with ours
        # on demand (the daemon)
        self.workspace_roots = [real_path(r) for r in workspace_roots]
        self.allowed = set()  # directories local clients registered
        self.capacity = capacity
        self.idle_timeout = idle_timeout
        self.activity = activity
        self.on_demand_log_dir = on_demand_log_dir
        self._session_env = {}
        self._launches = {}
        self._numbers = itertools.count(1)
        self._nursery = None
        self.idle_since = None  # when the last runner ended (set by run)

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
        async with subreaper(), trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._serve_link)
            if self.spares:
                nursery.start_soon(self._start_spares)
            try:
                await self.supervisor.run(self.specs(), task_status=_Relay(task_status, self._slots_online, self))
            except* GaveUp as group:
                self._gave_up(first_gave_up(group))
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


class _Relay:
    """The supervisor's task status: reports `host` started (as `Host.run` declares, not the
    supervisor the supervisor reports) and sets `event`."""

    def __init__(self, status: trio.TaskStatus[Host], event: trio.Event, host: Host) -> None:
        self._status, self._event, self._host = status, event, host

    def started(self, value: object = None) -> None:
        self._status.started(self._host)
        self._event.set()
