"""Run the API server inside a trio nursery and stop it gracefully.

The listening socket may be bound by the caller before quart is even
imported, so a runner can dial it while the server is still starting (its
connection waits in the backlog). Shutdown closes every websocket with 1001
first, so hypercorn does not wait out its graceful timeout (G1).

Hosts tell the server over their link which secret (by its hash) each of
their runners will present; the hashes go to the store, so a runner can
re-register after a server restart, and are revoked when the host reports
the process gone.
"""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
from dataclasses import dataclass
from typing import Any

import trio

import protocol as p
from protocol import events as ev

from ..link.memory import LinkEnd
from ..store import Store
from .guard import Guard
from .hub import EventHub
from .sockets import url_of
from .registry import RunnerRegistry
from .state import ServerState
from .turns import TurnService

log = logging.getLogger("omnigent.server")

CREDENTIALS_KEPT = 86400.0  # revoked runner credentials are forgotten a day later


@dataclass
class ServerHandle:
    url: str
    state: ServerState
    _done: trio.Event
    _scope: trio.CancelScope

    async def aclose(self, grace: float = 2.0) -> None:
        self.state.shutting_down.set()
        self.state.hub.close()
        with trio.move_on_after(grace):
            await self._done.wait()
        self._scope.cancel()


async def run_server(
    store: Store,
    sock: socket.socket,
    *,
    token: str | None,
    host_links: list[LinkEnd] = (),
    runner_wait: float = 30.0,
    max_losses: int = 5,
    max_attempts: int | None = None,  # the old name of max_losses
    allow_hosts: tuple[str, ...] = (),
    ping_interval: float = 1.0,
    ping_allowance: float = 6.0,
    adopt_grace: float | None = None,
    task_status: trio.TaskStatus[ServerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve

    from .app import create_app

    url = url_of(sock)
    done = trio.Event()
    if adopt_grace is None:
        # turns left running by a process that is gone can never finish: say so
        store.interrupt_orphaned_turns(_pid_alive)
    store.prune_runner_credentials(older_than=CREDENTIALS_KEPT)
    bind_host, port = sock.getsockname()[:2]
    guard = Guard(port=port, bind_host=bind_host, allow_hosts=frozenset(h.lower() for h in allow_hosts))
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            hub = EventHub()
            registry = RunnerRegistry()
            turns = TurnService(store, hub, registry, nursery, runner_wait=runner_wait,
                                max_losses=max_losses, max_attempts=max_attempts,
                                adopt_grace=adopt_grace or 0.0)
            if adopt_grace is not None:
                # `omnigent server`: a dead predecessor's turns are ours now; the running ones
                # wait for their runners to reconnect and claim them (server/adoption.py)
                taken = turns.take_over(_pid_alive)
                if taken:
                    log.info("took over %d turn(s) of a previous server process", len(taken))
            state = ServerState(store, hub, registry, turns, token, guard=guard,
                                ping_interval=ping_interval, ping_allowance=ping_allowance)
            for link in host_links:
                state.host_events.links.append(link)
                nursery.start_soon(_consume_host, state, link)
            config = Config()
            config.bind = [f"fd://{sock.detach()}"]
            config.accesslog = None
            config.errorlog = log
            config.graceful_timeout = 1.0
            config.websocket_max_message_size = p.MAX_FRAME_BYTES
            app = create_app(state)

            async def _serve(task_status: trio.TaskStatus[Any]) -> None:
                try:
                    await serve(app, config, shutdown_trigger=state.shutting_down.wait,
                                task_status=task_status)
                finally:
                    done.set()
                    nursery.cancel_scope.cancel()

            await nursery.start(_serve)
            task_status.started(ServerHandle(url, state, done, scope))


async def _consume_host(state: ServerState, link: LinkEnd) -> None:
    async for frame in link.receive:
        try:
            _host_frame(state, frame)
        except sqlite3.Error as exc:  # a full disk must not end the server: that runner is refused
            log.error("could not store what the host said (%s): %s", frame.kind, exc)


def _host_frame(state: ServerState, frame: p.Frame) -> None:
    """Apply one frame the host sent: a runner's credential, launch or exit."""
    if isinstance(frame, p.RunnerCredential):
        if not state.store.add_runner_credential(frame.runner_id, frame.secret_hash, kind="host"):
            log.warning("host re-used the known runner id %s: its new secret is ignored", frame.runner_id)
        state.registry.notify_changed()  # a runner that dialled first is waiting for this
    elif isinstance(frame, p.RunnerLaunched):
        state.registry.pids[frame.runner_id] = frame.pid
    elif isinstance(frame, p.RunnerExited):
        error = frame.reason + (f"\n{frame.log_tail}" if frame.log_tail else "")
        if frame.runner_id:
            state.registry.record_exit(frame.runner_id, frame.reason, error)
        if frame.gave_up:
            state.registry.give_up(error)
            for session_id in state.hub.session_ids():  # tell whoever watches, not just the next turn
                state.hub.publish(session_id, ev.RUNNERS_GAVE_UP, reason=error)
        if frame.runner_id:
            state.store.revoke_runner_credential(frame.runner_id)  # its secret opens nothing now


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is gone too
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
