"""The tree of `omnigent run`: server + host + a front end, in one trio.run.

The listening socket is bound first and the host launches its runner before
the server's heavy imports happen, so runner start-up (dominated by importing
openai) overlaps server start-up. Leaving the front end ends the tree in
order: runners first (so none is restarted), then the server, then the store.
"""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from supervisor import RestartPolicy

from .host import Host
from .host.pool import DEFAULT_POLICY
from .link import memory_link
from .logs import close_log, logs_dir, open_log, prune
from .tuning import Tuning

if TYPE_CHECKING:
    from .client import OmnigentClient

SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


async def run_tree(
    db_path: Path,
    make_front: Callable[[], Callable[[OmnigentClient], Awaitable[int]]],
    *,
    runners: int = 1,
    workspace: str | None = None,
    handle_sigint: bool = True,
    policy: RestartPolicy = DEFAULT_POLICY,
    tuning: Tuning = Tuning(),
    bind: tuple[str, int] = ("127.0.0.1", 0),
    token: str | None = None,
    require_client_token: bool = False,
) -> int:
    """Run a front end against a fresh in-process server and runner pool; returns the exit code.

    `make_front` is called only after the runner is launched, so the front
    end's imports (httpx, ...) overlap the runner's start-up too.
    """
    from .server.sockets import LOOPBACK, bind_socket, url_of

    sock = bind_socket(*bind)
    url = url_of(sock)
    token = token or secrets.token_urlsafe(32)
    server_end, host_end = memory_link()
    log_handler = open_log("host")
    prune(logs_dir() / "runner")
    host = Host(url, token, host_end, log_dir=logs_dir(), workspace=workspace or os.getcwd(),
                runners=runners, policy=policy)
    exit_code = 0
    store = None
    try:
        async with trio.open_nursery() as nursery:
            host_scope = trio.CancelScope()
            host_done = trio.Event()

            async def run_host() -> None:
                try:
                    with host_scope:
                        await host.run()
                finally:
                    host_done.set()

            nursery.start_soon(run_host)
            if runners:
                with trio.move_on_after(2):  # the runner imports openai while the server imports quart
                    await host.first_launch.wait()
            from .client import OmnigentClient
            from .server.serve import run_server
            from .store import Store

            store = Store(db_path)
            front = make_front()
            server = await nursery.start(lambda task_status: run_server(
                store, sock, token=token, host_links=[server_end], runner_wait=tuning.runner_wait,
                max_losses=tuning.turn_losses, ping_interval=tuning.ping_interval,
                ping_allowance=tuning.ping_allowance, loopback_only=bind[0] in LOOPBACK,
                require_client_token=require_client_token, task_status=task_status))
            front_scope = trio.CancelScope()

            async def on_signals() -> None:
                nonlocal exit_code
                sigs = list(SIGNAL_EXIT) if handle_sigint else [signal.SIGTERM, signal.SIGHUP]
                with trio.open_signal_receiver(*sigs) as received:
                    async for signum in received:
                        exit_code = SIGNAL_EXIT[signum]
                        front_scope.cancel()
                        return

            nursery.start_soon(on_signals)
            try:
                with front_scope:
                    async with OmnigentClient(url, token=token) as client:
                        code = await front(client)
                        exit_code = exit_code or code
            finally:
                with trio.CancelScope(shield=True):
                    host_scope.cancel()
                    with trio.move_on_after(host.shutdown_grace + 1):
                        await host_done.wait()  # runners stopped before the server goes
                    await server.aclose()
                nursery.cancel_scope.cancel()
    finally:
        if store is not None:
            store.close()
        close_log(log_handler)
    return exit_code
