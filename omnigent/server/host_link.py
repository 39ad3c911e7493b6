"""One host's link to the server, independent of the transport, and what its frames do.

`/v1/hosts/{host_id}/ws` adapts quart's websocket to `Transport`; tests
drive the same code over memory channels under a MockClock. The link: the
host secret bound to that id (its sha256 is in `hosts`; 4003 otherwise, and
a live link of the host is left alone), a `HostHello` for that id within
`hello_timeout` (4008, or 4000/4002 for a bad one), then `HostHelloAck` with
the host's new generation (bumped in the store for every accepted link).
From then on frames flow both ways exactly as over the in-process memory
link: the host's frames go through `consume_host`, the server's
(`RunnerOnline`, `KillRunner`, `LaunchRunner`, `Ping`) come from
`HostConn.link`. The server pings; a host silent for `ping_allowance` pings
is offline (closed 4008). A second link for the same host id replaces the
first (closed 4009); revoking the host closes its link with 4003; shutdown
closes it with 1001 (G1).

`consume_host` serves every host link, in-process or websocket: it stores
runner credentials (with the host that sent them, so the server knows which
host launched each runner), records launches and exits, and hands
`LaunchResult`s to the request waiting for them. A host may speak only of
its own runners: a frame about a runner id another host announced is
ignored.
"""

from __future__ import annotations

import logging
import sqlite3

import trio

import protocol as p
from protocol import events as ev

from ..link.memory import LinkEnd, memory_link
from ..link.runner_secrets import secret_matches
from .registry import LOCAL_HOST, HostConn
from .runner_link import Transport
from .state import ServerState
from .ticks import sleep_to_tick

log = logging.getLogger("omnigent.server.hosts")

WRONG_SECRET = 4003
REPLACED = 4009
SILENT = 4008
# what a host may send once its hello is accepted (Ping/Pong are answered here)
_HOST_FRAMES = (p.RunnerCredential, p.RunnerLaunched, p.RunnerExited, p.LaunchResult)
TOUCH_EVERY = 30.0  # seconds between `last_seen_at` writes while a link is up


async def serve_host(state: ServerState, host_id: str, transport: Transport, secret: str | None) -> None:
    """Serve one host link until it ends; `secret` is what the peer presented."""
    row = state.store.get_host(host_id) if host_id != LOCAL_HOST else None
    if row is None or row["revoked_at"] is not None or not secret_matches(secret, row["secret_hash"]):
        log.warning("host %s: refused a link without its secret", host_id[:60])
        await transport.close(WRONG_SECRET, "wrong, missing or revoked secret for this host id")
        return
    try:
        with trio.fail_after(state.hello_timeout):
            hello = p.decode(await transport.receive())
        if not isinstance(hello, p.HostHello) or hello.host_id != host_id:
            raise p.ProtocolError("first frame must be a host hello for this host id")
    except p.ProtocolError as exc:
        await transport.close(exc.close_code, exc.reason[:120])
        return
    except trio.TooSlowError:
        await transport.close(SILENT, "no hello")
        return
    # what the host declares replaces what it registered with; nothing declared keeps that
    roots = [r for r in hello.workspace_roots if r.startswith("/") and "\0" not in r][:256]
    try:
        generation = state.store.accept_host_link(host_id, workspace_roots=roots or None,
                                                  capacity=hello.capacity if hello.capacity > 0 else None)
        row = state.store.get_host(host_id) or row
    except sqlite3.Error as exc:
        log.error("host %s: could not store its link: %s", host_id, exc)
        await transport.close(1011, "the server could not store this link")
        return
    server_end, host_end = memory_link()
    conn = HostConn(host_id, server_end, generation, name=hello.name[:200] or row["name"], pid=hello.pid,
                    capacity=row["capacity"], permissions=_policy(hello.permissions))
    old = state.registry.attach_host(conn, row["workspace_roots"])
    if old is not None:
        log.warning("host %s: a new link replaces the one of generation %d", host_id, old.generation)
        old.kick(REPLACED, "replaced by a newer link of this host")
    _claim_runners(state, host_id, hello.runners)
    log.info("host %s (%s, pid %d) linked, generation %d", host_id, conn.name or "unnamed", hello.pid, generation)
    # why the link ends, (close code, reason); the first wins. The close is sent only once every
    # task of the link has stopped, so nothing is ever sent on a closed websocket.
    ending: list[tuple[int, str]] = []
    try:
        await transport.send(p.encode(p.HostHelloAck(ping_interval=state.ping_interval, generation=generation)))
        for runner_id in state.registry.host_runners(host_id):  # told again: it may have said hello
            conn.link.post(p.RunnerOnline(runner_id=runner_id))  # while this host's link was down
        async with trio.open_nursery() as n:
            n.start_soon(_end_on_shutdown, state, n, ending)
            n.start_soon(_end_when_kicked, conn, n, ending)
            n.start_soon(_send_frames, transport, host_end, n)
            n.start_soon(_ping, state, conn, n, ending)
            n.start_soon(_receive_frames, conn, transport, host_end, n, ending)
            n.start_soon(consume_host, state, server_end, host_id)
        if ending:
            with trio.move_on_after(1):
                await transport.close(*ending[0])
    finally:
        state.registry.detach_host(conn)
        server_end.send.close()
        host_end.send.close()
        try:
            state.store.touch_host(host_id)
        except sqlite3.Error:
            pass
        log.info("host %s: link of generation %d ended", host_id, generation)


def _policy(declared: str) -> str:
    """A host's declared tool policy; anything unknown counts as the strictest."""
    return declared if declared in ("ask", "auto", "deny") else "deny"


def _claim_runners(state: ServerState, host_id: str, runner_ids: list[str]) -> None:
    """A reconnecting host re-announces its live runners: those whose credential it sent are its own."""
    for runner_id in runner_ids[:10_000]:
        if state.registry.runner_host.get(runner_id) == host_id:
            continue
        row = state.store.runner_credential(runner_id)
        if row is not None and row["host_id"] == host_id:
            state.registry.runner_host[runner_id] = host_id


async def _receive_frames(conn: HostConn, transport: Transport, host_end: LinkEnd, n: trio.Nursery,
                          ending: list[tuple[int, str]]) -> None:
    try:
        while True:
            frame = p.decode(await transport.receive())
            conn.last_pong = trio.current_time()  # any frame proves the host is alive
            if isinstance(frame, p.Pong):
                continue
            if isinstance(frame, p.Ping):
                conn.link.post(p.Pong(ts=frame.ts))
            elif isinstance(frame, _HOST_FRAMES):
                host_end.post(frame)
            else:
                raise p.ProtocolError(f"a host may not send {frame.kind!r}")
    except p.ProtocolError as exc:
        log.warning("host %s: %s", conn.host_id, exc.reason)
        ending.append((exc.close_code, exc.reason[:120]))
    n.cancel_scope.cancel()


async def _send_frames(transport: Transport, host_end: LinkEnd, n: trio.Nursery) -> None:
    async for frame in host_end.receive:
        await transport.send(p.encode(frame))
    n.cancel_scope.cancel()


async def _ping(state: ServerState, conn: HostConn, n: trio.Nursery, ending: list[tuple[int, str]]) -> None:
    touched = trio.current_time()
    while True:
        await sleep_to_tick(state.ping_interval)  # with the runners' pings (ticks.py)
        now = trio.current_time()
        silent = now - conn.last_pong
        if silent > state.ping_interval * state.ping_allowance:
            log.warning("host %s: no answer to pings for %.1f s: offline", conn.host_id, silent)
            ending.append((SILENT, "no answer to pings"))
            n.cancel_scope.cancel()
            return
        conn.link.post(p.Ping(ts=now))
        if now - touched >= TOUCH_EVERY:
            touched = now
            try:
                state.store.touch_host(conn.host_id)
            except sqlite3.Error:
                pass


async def _end_when_kicked(conn: HostConn, n: trio.Nursery, ending: list[tuple[int, str]]) -> None:
    await conn.kicked.wait()
    ending.append((conn.kick_code, conn.kick_reason))
    n.cancel_scope.cancel()


async def _end_on_shutdown(state: ServerState, n: trio.Nursery, ending: list[tuple[int, str]]) -> None:
    await state.shutting_down.wait()
    ending.append((1001, "server shutting down"))  # not 1006 after a 3 s hang (G1)
    n.cancel_scope.cancel()


def revoke_host(state: ServerState, host_id: str) -> None:
    """`DELETE /v1/hosts/{id}`: its secret and its runners' secrets open nothing any more.

    Its live link is closed with 4003 and its runners online are dropped (their sessions move
    on as after any runner loss); a runner that dials back is refused with 4003.
    """
    state.store.revoke_host(host_id)
    state.store.revoke_host_runner_credentials(host_id)
    conn = state.registry.hosts.get(host_id)
    if conn is not None:
        conn.kick(WRONG_SECRET, "host revoked")
    for runner_id in state.registry.host_runners(host_id):
        runner = state.registry.online.get(runner_id)
        if runner is not None:
            state.registry.unregister(runner, "its host was revoked")  # its connection ends


# --- what a host's frames do ------------------------------------------------------


async def consume_host(state: ServerState, link: LinkEnd, host_id: str = LOCAL_HOST) -> None:
    """Apply every frame `host_id` sends on `link` until the link ends."""
    async for frame in link.receive:
        try:
            host_frame(state, host_id, frame)
        except sqlite3.Error as exc:  # a full disk must not end the server: that runner is refused
            log.error("could not store what host %s said (%s): %s", host_id, frame.kind, exc)


def host_frame(state: ServerState, host_id: str, frame: p.Frame) -> None:
    """Apply one frame the host sent: a runner's credential, launch or exit, or a launch result."""
    registry = state.registry
    if isinstance(frame, p.RunnerCredential):
        if state.store.add_runner_credential(frame.runner_id, frame.secret_hash, kind="host", host_id=host_id):
            registry.runner_host[frame.runner_id] = host_id
        else:
            log.warning("host %s re-used the known runner id %s: its new secret is ignored",
                        host_id, frame.runner_id)
        registry.notify_changed()  # a runner that dialled first is waiting for this
    elif isinstance(frame, p.LaunchResult):
        waiter = state.launches.get(frame.request_id)
        if waiter is not None:
            try:
                waiter.send_nowait(frame)
            except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                pass  # answered twice, or nobody waits any more
    elif not _own(state, host_id, getattr(frame, "runner_id", "")):
        log.warning("host %s spoke of runner %s, which it did not launch: ignored",
                    host_id, getattr(frame, "runner_id", "")[:80])
    elif isinstance(frame, p.RunnerLaunched):
        registry.pids[frame.runner_id] = frame.pid
        registry.notify_changed()
    elif isinstance(frame, p.RunnerExited):
        _runner_exited(state, host_id, frame)


def _own(state: ServerState, host_id: str, runner_id: str) -> bool:
    if not runner_id:
        return True  # a host-wide report (gave up)
    return state.registry.host_of(runner_id) == host_id


def _runner_exited(state: ServerState, host_id: str, frame: p.RunnerExited) -> None:
    registry = state.registry
    error = frame.reason + (f"\n{frame.log_tail}" if frame.log_tail else "")
    seen = frame.runner_id in registry.online or frame.runner_id in registry.departed
    if frame.runner_id:
        registry.record_exit(frame.runner_id, frame.reason, error)
    if frame.gave_up:
        if host_id == LOCAL_HOST:  # the in-process pool is every runner this tree has
            registry.give_up(error)
            for session_id in state.hub.session_ids():  # tell whoever watches, not just the next turn
                state.hub.publish(session_id, ev.RUNNERS_GAVE_UP, reason=error)
        else:
            log.error("host %s gave up on its runners: %s", host_id, frame.reason)
    if frame.runner_id:
        state.store.revoke_runner_credential(frame.runner_id)  # its secret opens nothing now
        if not seen:  # it died before its hello: sessions bound to it at launch move on now
            state.turns.runner_left(frame.runner_id)
