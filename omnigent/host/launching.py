"""One runner's launch and exit, as the supervisor calls them, for every runner of a pool.

Every (re)start gets a fresh `runner_<hex>` id, so a replacement is never
confused with the runner it replaces. A runner counts as started only once
the server has seen its hello (the server says so over the link); the host
tells the server when a runner process starts and ends, with the exit code
or signal and its log tail, and after every exit kills what the tools of
runners that are gone left behind.

Credentials: each launch mints a fresh secret for its runner id. The secret
goes only into that runner's environment (`OMNIGENT_RUNNER_TOKEN`); the
server is told its hash in a `RunnerCredential` frame posted *before* the
process is launched. Links keep order but the server reads them on its own
time, so a runner can still dial first: the server waits a bounded time for
the credential of an id it does not know yet (`runner_link.serve_runner`).
The host never hands a runner its own or a client's credentials.

`RunnerLaunches` is the base of `pool.Host`: it declares the state these
callbacks share with the rest of the pool (`Host.__init__` sets it).
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import trio

import protocol as p
from supervisor import ProcessConfig, describe_returncode, read_log_tail

from ..config.timeline import mark
from ..link.memory import LinkEnd
from ..link.runner_secrets import CLIENT_TOKEN_VARS, ENV_VAR, hash_secret, mint_secret
from ..tools import reaper
from .env import TOOL_POLICY_VAR

if TYPE_CHECKING:
    from .on_demand import Launch

log = logging.getLogger("omnigent.host")


def runner_argv(environ: Mapping[str, str] = os.environ) -> list[str]:
    """`OMNIGENT_RUNNER_PYTHON` picks another interpreter (a venv, a wrapper) for runners."""
    return [environ.get("OMNIGENT_RUNNER_PYTHON") or sys.executable, "-m", "omnigent.runner"]


class RunnerLaunches:
    """Preparing, launching and seeing off a pool's runner processes; the pool's shared state."""

    server_url: str
    tool_policy: str
    link: LinkEnd
    log_dir: Path
    workspace: str
    env: dict[str, str]
    on_demand_log_dir: str
    first_launch: trio.Event
    idle_since: float | None
    _online: dict[str, trio.Event]
    _pids: dict[str, int]
    _slot_of: dict[str, str]
    _session_env: dict[str, dict[str, str]]

    # --- what the supervisor calls ------------------------------------------

    def _prepare(self, slot: str, launch: Launch | None = None) -> ProcessConfig:
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

    def live_runners(self) -> list[str]:
        """Ids of the runner processes alive now (fixed slots and on demand)."""
        return list(self._online)
