"""The tree of `omnigent run`: server + host + a front end, in one trio.run.

The listening socket is bound first and the host launches its runner before
the server's heavy imports happen, so runner start-up (dominated by importing
openai) overlaps server start-up. Leaving the front end ends the tree in
order: runners first (so none is restarted), then the server, then the store.

Credentials: the client token this tree's front end uses is generated here
and handed to it in memory, so another local user cannot read conversations
through the port (the server requires it on loopback too). Runners get no
client token: the host mints each one its own secret.

What can fail on disk is checked before the runner is launched, with
nothing written when it fails: the data dir (0700), free space, the store
file (`check_store`: sqlite3 only, so the launch is not delayed), the log.
The store itself (sqlite-utils, migrations) is opened while the runner
imports openai; a failure there still leaves the tree as one bare
`StoreError`, never inside an ExceptionGroup, so the CLI prints one line.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import trio

from supervisor import RestartPolicy

from ..host import Host
from ..host.pool import DEFAULT_POLICY
from ..link.memory import memory_link
from ..config.dirs import check_free_space, describe, private_dir
from ..config.logs import close_log, logs_dir, open_log, prune
from ..config.timeline import mark
from ..config.tuning import Tuning
from .signals import SignalExit

if TYPE_CHECKING:
    from ..client import OmnigentClient
    from .early import EarlyRunner



async def run_tree(
    db_path: Path,
    make_front: Callable[[], Callable[[OmnigentClient], Awaitable[int]]],
    *,
    runners: int = 1,
    spares: int = 0,
    spare_gate: trio.Event | None = None,
    workspace: str | None = None,
    handle_sigint: bool = True,
    policy: RestartPolicy = DEFAULT_POLICY,
    tuning: Tuning = Tuning(),
    bind: tuple[str, int] = ("127.0.0.1", 0),
    token: str | None = None,
    require_token: bool = True,
    allow_hosts: tuple[str, ...] = (),
    take_over: bool = False,
    permission_mode: str | None = None,
    early: EarlyRunner | None = None,
) -> int:
    """Run a front end against a fresh in-process server and runner pool; returns the exit code.

    `make_front` is called only after the runner is launched, so the front
    end's imports (httpx, ...) overlap the runner's start-up too. The API
    requires `token`, generated when None; only with `require_token=False`
    (`omnigent server` on loopback without --token) does None leave it open.
    Raises StoreError or DiskError (one line each, nothing written) when the
    store, the data dir or the logs (`logs_dir()`) cannot be used.

    `spares` more runner slots start once the `runners` are online and
    `spare_gate` is set (at once without a gate): the REPL sets it when its
    first turn is done or it waits at a terminal prompt, so the spare's
    start-up does not compete with the first answer (see `host.pool`).

    `permission_mode` (`--permission-mode ask|auto|deny`) is the in-process
    host's tool policy: the effective mode of every session here is never
    above it. None: a local run trusts the YAML it read from this machine's
    disk (the session's own mode decides); a server (`take_over`, bundles come
    from clients) is "ask" then. Its runners get the same policy in
    OMNIGENT_TOOL_POLICY ("auto" when the session's own mode decides: the
    server here already applied it).

    `early` (`tree.early.start`, spawned by the CLI before this tree was
    imported) becomes the first runner launch when it matches it; it is
    killed and reaped here when it does not, or when the tree fails first.
    """
    from ..server.sockets import bind_socket, url_of

    sock = bind_socket(*bind)
    mark("socket.bound")
    try:
        log_root = logs_dir()
        log_handler = _open_files(Path(db_path), log_root)
    except BaseException:
        sock.close()
        if early is not None:
            early.discard()
        raise
    url = url_of(sock)
    if require_token:
        token = token or secrets.token_urlsafe(32)
    server_end, host_end = memory_link()
    local_policy = permission_mode or ("ask" if take_over else None)
    launcher = None
    if early is not None:
        from .early import EarlyLauncher

        launcher = EarlyLauncher(early)
    host = Host(url, host_end, log_dir=log_root, workspace=workspace or os.getcwd(),
                runners=runners, policy=policy, spares=spares, tool_policy=local_policy or "auto",
                launcher=launcher)
    from ..store.errors import StoreError

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
            if spares:
                nursery.start_soon(_release_spares, host, spare_gate)
            if runners:
                with trio.move_on_after(2):  # the runner imports openai while the server imports quart
                    await host.first_launch.wait()
            from ..client import OmnigentClient
            from ..server.serve import run_server
            from ..store import Store

            from ..store.db import verify

            try:
                store = Store(db_path)
                verify(store.conn, db_path)  # while the runner imports: off the critical path
            except StoreError as exc:
                raise _Escaping(exc) from None
            front = make_front()
            server = await nursery.start(lambda task_status: run_server(
                store, sock, token=token, host_links=[server_end], runner_wait=tuning.runner_wait,
                max_losses=tuning.turn_losses, ping_interval=tuning.ping_interval,
                ping_allowance=tuning.ping_allowance, host_grace=tuning.host_grace, allow_hosts=allow_hosts,
                adopt_grace=tuning.adopt_grace if take_over else None, task_status=task_status))
            server.state.registry.local_permissions = local_policy  # before any turn is dispatched
            mark("server.ready")
            front_scope = trio.CancelScope()
            signals = SignalExit(front_scope, sigint=handle_sigint)
            nursery.start_soon(signals.watch)
            try:
                with front_scope:
                    async with OmnigentClient(url, token=token) as client:
                        exit_code = await front(client)
            finally:
                exit_code = signals.code or exit_code
                with trio.CancelScope(shield=True):
                    host_scope.cancel()
                    with trio.move_on_after(host.shutdown_grace + 1):
                        await host_done.wait()  # runners stopped before the server goes
                    await server.aclose()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        escaping = _only(group, _Escaping)
        if escaping is not None:
            raise escaping.error from None
        failed = _only(group, sqlite3.Error)
        if failed is None:
            raise
        # e.g. the disk filled mid-run: SQLite rolled the write back, the store is intact
        what = "cannot write store" if "full" in str(failed) else "store failed"
        raise StoreError(f"{what}: {db_path}: {describe(failed)}") from None
    finally:
        if early is not None:
            early.discard()  # no-op once adopted: the host stopped it with the others
        if store is not None:
            store.close()
        close_log(log_handler)
    return exit_code


async def _release_spares(host: Host, gate: trio.Event | None) -> None:
    if gate is not None:
        await gate.wait()
    host.release_spares()


def _open_files(db_path: Path, log_root: Path):
    """Check the store and open the host log before anything is launched; returns the log handler."""
    from ..store.db import check_store

    # Before anything is touched: a full disk (where even reading a WAL store
    # fails), then a store this version cannot use.
    check_free_space(_existing(db_path.parent))
    check_store(db_path)
    private_dir(db_path.parent, "cannot create data directory")
    private_dir(log_root, "cannot create log folder")
    handler = open_log("host", log_root)
    try:
        private_dir(log_root / "runner", "cannot create log folder")
        prune(log_root / "runner")
    except BaseException:
        close_log(handler)
        raise
    return handler


def _existing(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


class _Escaping(Exception):
    """Carries an error out of the nursery, to be re-raised bare (not in a group)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


_E = TypeVar("_E", bound=BaseException)


def _only(group: BaseExceptionGroup, kind: type[_E]) -> _E | None:
    """The single leaf of `group` if it is a `kind`, else None."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for sub in exc.exceptions:
                walk(sub)
        else:
            leaves.append(exc)

    walk(group)
    return leaves[0] if len(leaves) == 1 and isinstance(leaves[0], kind) else None
