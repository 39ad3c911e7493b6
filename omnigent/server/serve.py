"""Run the API server inside a trio nursery and stop it gracefully.

The listening socket may be bound by the caller before quart is even
imported, so a runner can dial it while the server is still starting (its
connection waits in the backlog). Shutdown closes every websocket with 1001
first, so hypercorn does not wait out its graceful timeout (G1).

Hosts tell the server over their link which secret (by its hash) each of
their runners will present; the hashes go to the store, so a runner can
re-register after a server restart, and are revoked when the host reports
the process gone. The in-process host's memory links (`host_links`) and every
remote host's websocket link (`host_link.serve_host`) go through the same
`host_link.consume_host`; the in-process host is `host_local`.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any

import trio

import protocol as p
from protocol import events as ev

from ..config.timeline import count_task_steps
from ..link.memory import LinkEnd
from ..store import Store
from .guard import Guard
from .host_link import consume_host
from .hub import EventHub
from .sockets import BACKLOG, url_of
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
    host_links: Sequence[LinkEnd] = (),
    runner_wait: float = 30.0,
    max_losses: int = 5,
    max_attempts: int | None = None,  # the old name of max_losses
    allow_hosts: tuple[str, ...] = (),
    ping_interval: float = 1.0,
    ping_allowance: float = 6.0,
    host_grace: float = 10.0,
    adopt_grace: float | None = None,
    task_status: trio.TaskStatus[ServerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    from hypercorn.trio import serve

    from . import connections
    from .app import create_app

    url = url_of(sock)
    done = trio.Event()
    orphaned: list[dict] = []
    if adopt_grace is None:
        # turns left running by a process that is gone can never finish: say so
        orphaned = store.interrupt_orphaned_turns(_pid_alive)
    store.prune_runner_credentials(older_than=CREDENTIALS_KEPT)
    bind_host, port = sock.getsockname()[:2]
    guard = Guard(port=port, bind_host=bind_host, allow_hosts=frozenset(h.lower() for h in allow_hosts))
    count_task_steps()  # a benchmark's timeline: each segment's task steps
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            hub = EventHub(store)
            await nursery.start(hub.run)  # batches text deltas into the stored log
            _announce_interrupted(hub, orphaned)
            registry = RunnerRegistry(host_grace=host_grace, host_lookup=store.runner_host)
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
                nursery.start_soon(consume_host, state, link)
            connections.install()  # hypercorn's connections, with fewer task steps and writes a request
            config = connections.Config()
            config.bind = [f"fd://{sock.detach()}"]
            config.accesslog = None
            config.errorlog = log
            config.graceful_timeout = 1.0
            config.backlog = BACKLOG  # hypercorn listens again on the socket it is given
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


def _announce_interrupted(hub: EventHub, turns: list[dict]) -> None:
    """Watchers of a turn left by a process that is gone hear that it ended (not "running" forever)."""
    for turn in turns:
        reason = "the process running it is gone (a restart or a crash)"
        with hub.transaction(turn["conversation_id"]) as tx:
            tx.publish(ev.TURN_INTERRUPTED, turn_id=turn["id"], reason=reason, attempt=turn["attempt"])
            tx.publish(ev.SESSION_STATUS, status="idle")


_consume_host = consume_host  # the old name (tests/support/fake_runners.py)


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
