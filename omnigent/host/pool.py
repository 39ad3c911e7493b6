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
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path

import trio

import protocol as p
from supervisor import (
    ChildSpec,
    GaveUp,
    ProcessConfig,
    RestartPolicy,
    Supervisor,
    describe_returncode,
    process_child,
    read_log_tail,
)

from ..link.memory import LinkEnd
from ..link.runner_secrets import CLIENT_TOKEN_VARS, ENV_VAR, hash_secret, mint_secret

log = logging.getLogger("omnigent.host")

DEFAULT_POLICY = RestartPolicy(base=0.05, factor=2.0, cap=5.0, jitter=0.1, reset_after=30.0,
                               intensity=5, period=30.0)


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
    ) -> None:
        self.server_url = server_url
        self.link = link
        self.log_dir = Path(log_dir)
        self.workspace = workspace
        self.count = runners
        self.env = {k: v for k, v in (os.environ if env is None else env).items() if k not in CLIENT_TOKEN_VARS}
        self.policy = policy
        self.startup_timeout = startup_timeout
        self.shutdown_grace = shutdown_grace
        self.launcher = launcher
        self.supervisor = Supervisor(policy, name="host")
        self._online: dict[str, trio.Event] = {}
        self._slot_of: dict[str, str] = {}   # runner id -> slot name
        self.first_launch = trio.Event()      # lets the caller overlap its own start-up with ours

    # --- what the supervisor calls ------------------------------------------

    def _prepare(self, slot: str) -> ProcessConfig:
        runner_id = f"runner_{uuid.uuid4().hex}"
        self._online[runner_id] = trio.Event()
        self._slot_of[runner_id] = slot
        secret = mint_secret()
        self.link.post(p.RunnerCredential(runner_id=runner_id, secret_hash=hash_secret(secret)))
        env = {**self.env, "OMNIGENT_SERVER_URL": self.server_url,
               "OMNIGENT_RUNNER_ID": runner_id, ENV_VAR: secret}
        return ProcessConfig(argv=runner_argv(self.env), env=env, cwd=self.workspace,
                             log_path=self.log_dir / "runner" / f"{runner_id}.log", label=runner_id)

    async def _ready(self, config: ProcessConfig, _handle) -> None:
        await self._online[config.label].wait()

    def _launched(self, config: ProcessConfig, handle) -> None:
        log.info("Launched runner %s for workspace %s (pid=%d)", config.label, self.workspace, handle.pid)
        self.first_launch.set()
        self.link.post(p.RunnerLaunched(runner_id=config.label, pid=handle.pid, log_path=str(config.log_path)))

    def _exited(self, config: ProcessConfig, _handle, returncode: int) -> None:
        runner_id = config.label
        self._online.pop(runner_id, None)
        self._slot_of.pop(runner_id, None)
        reason = describe_returncode(returncode)
        log.info("runner %s %s", runner_id, reason)
        self.link.post(p.RunnerExited(
            runner_id=runner_id, code=returncode if returncode >= 0 else None,
            signal=-returncode if returncode < 0 else None, reason=reason,
            log_tail=read_log_tail(config.log_path, lines=20) if returncode else "",
        ))

    def specs(self) -> list[ChildSpec]:
        return [
            process_child(
                slot, lambda slot=slot: self._prepare(slot), ready=self._ready, launcher=self.launcher,
                startup_timeout=self.startup_timeout, shutdown_grace=self.shutdown_grace,
                on_launched=self._launched, on_exit=self._exited,
            )
            for slot in (f"runner-{i}" for i in range(self.count))
        ]

    # --- running --------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Host] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the pool until cancelled; started once every runner is online.

        When a runner cannot stay up (restart intensity exceeded) the server is
        told why and the pool ends without taking the rest of the tree down:
        the server turns that into a clear error for whoever waits on a turn.
        """
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._serve_link)
            try:
                await self.supervisor.run(self.specs(), task_status=task_status)
            except* GaveUp as group:
                self._gave_up(group.exceptions[0])
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
                if slot is not None:
                    log.warning("killing runner %s: %s", frame.runner_id, frame.reason)
                    self.supervisor.kill_child(slot, frame.reason)
