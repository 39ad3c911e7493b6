"""`omnigent run AGENT --server URL`: the same REPL and `-p` as the local run, as clients of a server elsewhere.

Nothing is supervised in this process. The runners belong to this HOME's host
daemon for that server (`host.daemon_client.ensure_daemon`: reused, or
started detached), so they outlive the REPL: leaving it leaves the runner
and the session's binding in place, and a later resume, from here or from
another HOME, finds that runner online and reuses it.

Before the front end starts: the daemon runs and the cwd is allowed as a
workspace on it (over its 0600 control socket). A session is created with
`workspace=cwd` and this daemon's `host_id` (lazily, on the first message, as
locally). Before every turn (`place`: a runner that sat unused ends after an idle
timeout, so the one bound an hour ago may be gone), the model endpoint and
key this CLI resolved are handed to the daemon for that session (memory only:
never the store, a bundle or an argv), the bound runner is reused when it is
online; when it is not but this daemon still keeps a runner for the session
(its supervisor is replacing a crashed one, with a new id the server binds),
nothing is launched; else `POST /v1/hosts/{host_id}/runners` launches one in
the cwd (the server binds it) and its hello is awaited before the message goes out.

The bearer is `--token` or `OMNIGENT_REMOTE_AUTH_TOKEN`; it is used by this
process only (the daemon and the runners never see it).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from ..repl.options import FrontOptions
from ..repl.trace import trace
from .signals import SignalExit

if TYPE_CHECKING:
    from ..client import LaunchedRunner

HOST_OFFLINE_RETRY = 16.5  # seconds a 409 host_offline is retried (the original's figure)
LINK_WAIT = 30.0           # seconds to wait for the daemon's link to the server
FIRST_LINK_WAIT = 10.0     # at start-up; a server that is down is reported by the front end
RUNNER_WAIT = 60.0         # seconds for a launched runner to say hello


async def run_remote(options: FrontOptions, *, server_url: str, token: str | None, auth: dict[str, Any],
                     home: Path | None = None) -> int:
    """Run the front end of `options` against `server_url`; returns the exit code."""
    from ..client import OmnigentClient
    from ..host.daemon_client import DaemonError, ensure_daemon
    from ..repl.front import Front

    home = home or Path(os.environ.get("HOME") or Path.home())
    workspace = options.workspace or os.getcwd()
    try:
        daemon = await ensure_daemon(server_url, home=home, token=token)
        await daemon.allow_workspace(workspace)
        if not daemon.online:  # a fresh daemon: its link is up in ~50 ms, and then its host id is final
            await daemon.wait_online(FIRST_LINK_WAIT)
    except DaemonError as exc:
        print(f"Error: {exc}", file=sys.stderr, flush=True)
        return 1
    env = {name: value for name, value in (("OPENAI_BASE_URL", auth.get("base_url")),
                                           ("OPENAI_API_KEY", auth.get("api_key"))) if value}
    options.workspace = workspace
    options.session_fields = {"host_id": daemon.host_id}
    options.place = _Placer(daemon, workspace, env).place

    exit_code = 0
    async with trio.open_nursery() as nursery:
        front_scope = trio.CancelScope()
        # the REPL owns Ctrl-C (it cancels a turn); -p leaves it to us: exit 130
        signals = SignalExit(front_scope, sigint=options.prompt is not None)
        nursery.start_soon(signals.watch)
        with front_scope:
            async with OmnigentClient(server_url, token=token) as client:
                exit_code = await Front(options).run(client)
        nursery.cancel_scope.cancel()
    return signals.code or exit_code


class _Placer:
    """Gives a session its runner on this HOME's daemon (see module doc)."""

    def __init__(self, daemon, workspace: str, env: dict[str, str]) -> None:
        self.daemon = daemon
        self.workspace = workspace
        self.env = env

    async def place(self, client, session_id: str) -> None:
        from ..client import OmnigentError
        from ..host.daemon_client import DaemonError

        try:
            if self.env:
                await self.daemon.session_env(session_id, self.env)
            info = await client.get_session(session_id)
            runner_id = info.get("runner_id")
            if runner_id and info.get("runner_online"):
                trace(f"reusing runner id={runner_id!r}")
                trace(f"runner bound id={runner_id!r}")
                return
            if runner_id and await self.daemon.keeps_runner_for(session_id):
                # it crashed and our daemon's supervisor is replacing it (a new id, which the
                # server binds); a launch now would leave one runner too many
                trace(f"runner {runner_id!r} is being replaced by the host")
                return
            if not self.daemon.online and not await self.daemon.wait_online(LINK_WAIT):
                raise OmnigentError(f"the host daemon (pid {self.daemon.pid}) is not connected to "
                                    f"{client.base_url} yet; see its log under ~/.omnigent/logs/host-daemon/")
        except DaemonError as exc:
            raise OmnigentError(str(exc)) from None
        trace(f"POST /v1/hosts/{self.daemon.host_id}/runners session={session_id!r}")
        runner_id = (await self._launch(client, session_id)).runner_id
        # Waited for, although the server would hold a message for it: a message that
        # arrives before this runner's hello is placed on any idle runner of the host,
        # which has another session's model endpoint.
        await self._wait_online(client, runner_id)
        trace(f"runner bound id={runner_id!r}")

    async def _wait_online(self, client, runner_id: str) -> None:
        from ..client import OmnigentError

        with trio.move_on_after(RUNNER_WAIT):
            while True:
                status = await client.runner_status(runner_id)
                if status.get("online"):
                    return
                if status.get("error"):
                    raise OmnigentError(f"runner {runner_id} did not start: {status['error']}")
                await trio.sleep(0.05)  # no event says "this runner said hello"
        raise OmnigentError(f"runner {runner_id} did not come online within {RUNNER_WAIT:g} s")

    async def _launch(self, client, session_id: str) -> LaunchedRunner:
        """`client.hosts.launch_runner` in the cwd; a 409 `host_offline` is retried for a while."""
        from ..client import OmnigentError

        deadline = trio.current_time() + HOST_OFFLINE_RETRY
        while True:
            try:
                return await client.hosts.launch_runner(self.daemon.host_id, session_id=session_id,
                                                        workspace=self.workspace)
            except OmnigentError as exc:
                if exc.code != "host_offline" or trio.current_time() >= deadline:
                    raise
            await trio.sleep(0.25)  # the link is (re)connecting: no event says when it is back
