"""One runner's connection to the server, independent of the transport.

The websocket route adapts quart's websocket to `Transport`; tests drive the
same code over memory channels under a MockClock. The connection: the secret
bound to the runner id, a valid hello, then frames routed to the turns
waiting on them, pings on the ticks of one clock grid (none to a runner heard
from lately) and a hang verdict when it falls silent, 1001 on shutdown.

Who may connect as a runner id:

- Only a peer presenting the secret bound to that id (its sha256 is in the
  store's `runner_credentials`, put there by the launching host's
  `RunnerCredential` frame or by a client's `POST /v1/runners`). A host posts
  that frame before it launches the process, but the server reads its link
  on its own time, so a runner may dial first: an id without a credential
  yet is waited for, up to `state.credential_wait` (1 s), then refused. A wrong,
  missing or revoked secret gets 4003 at once. The client token opens nothing here.
- An id that is online is never taken over by a connection with the wrong
  secret (4003; the first stays registered). With the right secret (the
  runner reconnecting after a blip) the old connection is pinged: if it
  answers within `state.reconnect_probe` (1 s) the new one is closed with
  4009, otherwise the new one replaces it and the turn in flight on the old
  one is dispatched again on the new one.

A runner that reconnects lists the turns it still owes an end for
(`Hello.in_flight`). Before its first frame is read, the turn service adopts
those it expects (`adoption.py`: a restarted server's turns) by opening their
routes on this connection; the runner is told to `Cancel` every other one,
and everything it sends for those turns (up to and including their end) is
dropped here: a late result of a session that has moved on is never stored
or published.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import trio

import protocol as p

from ..config.timeline import mark
from ..link.runner_secrets import secret_matches
from .registry import RunnerConn
from .state import ServerState
from .ticks import sleep_to_tick

log = logging.getLogger("omnigent.server.runners")

WRONG_SECRET = 4003
ID_IN_USE = 4009
MAX_IN_FLIGHT = 100


class Transport(Protocol):
    async def receive(self) -> str | bytes: ...   # raises on close: the connection ends
    async def send(self, text: str) -> None: ...
    async def close(self, code: int, reason: str) -> None: ...


async def serve_runner(state: ServerState, runner_id: str, transport: Transport, secret: str | None) -> None:
    """Serve one runner connection until it ends; `secret` is what the peer presented."""
    credential = await _credential(state, runner_id, secret)
    if credential is None or not secret_matches(secret, credential["secret_hash"]):
        log.warning("runner %s: refused a connection without its secret", runner_id)
        await transport.close(WRONG_SECRET, "wrong or missing secret for this runner id")
        return
    try:
        with trio.fail_after(state.hello_timeout):
            hello = p.decode(await transport.receive())
        if not isinstance(hello, p.Hello) or hello.runner_id != runner_id:
            raise p.ProtocolError("first frame must be a hello for this runner id")
        mark("server.hello")
    except p.ProtocolError as exc:
        await transport.close(exc.close_code, exc.reason[:120])
        return
    except trio.TooSlowError:
        await transport.close(4008, "no hello")
        return
    outbox, outgoing = trio.open_memory_channel[p.Frame](256)
    conn = RunnerConn(hello.runner_id, hello.pid, list(hello.harnesses), outbox,
                      explicit=credential["kind"] == "explicit", features=frozenset(hello.features))
    if not await _claim_id(state, conn):
        log.warning("runner %s: refused a second connection while the first answers", runner_id)
        await transport.close(ID_IN_USE, "this runner id is online on another connection")
        return
    ended: list[str] = []  # why the connection ended; the first reason wins
    # turns of this runner that were refused: their frames are dropped until their end
    draining = conn.draining
    draining.update(state.turns.runner_reported(conn, _in_flight(hello)))
    for turn_id in draining:  # queued before any await: ahead of a TurnStart of another attempt of it
        conn.outbox.send_nowait(p.Cancel(turn_id=turn_id))
    state.host_events.runner_online(runner_id)
    if not conn.explicit:  # explicit runners adopt nothing: they serve only sessions bound to them
        state.turns.runner_joined(conn)
    try:
        acked = sorted(p.ACKNOWLEDGED_FEATURES.intersection(hello.features))
        await transport.send(p.encode(p.HelloAck(ping_interval=state.ping_interval, features=acked)))
        async with trio.open_nursery() as n:
            n.start_soon(_close_on_shutdown, state, transport, n)
            n.start_soon(_send_frames, transport, outgoing, n, state.hub.release)
            n.start_soon(_ping, state, conn, n, ended)
            n.start_soon(_receive_frames, conn, transport, n, ended, draining)
    finally:
        current = state.registry.online.get(runner_id)
        if current is not None and current is not conn:
            pass  # a reconnect of the same runner took over: nothing was lost, nothing to kill
        else:
            cause = ended[0] if ended else "disconnected"
            if cause.startswith("hung"):
                state.host_events.kill_runner(runner_id, cause)
            state.registry.unregister(conn, cause)
            state.turns.runner_left(runner_id)


async def _credential(state: ServerState, runner_id: str, secret: str | None) -> dict | None:
    """The live credential of `runner_id`, waiting a bounded time for one not yet known."""
    if not secret:
        return None
    row = state.store.runner_credential(runner_id)
    with trio.move_on_after(state.credential_wait):
        while row is None:
            await state.registry.wait_changed()  # _consume_host notifies when it stores one
            row = state.store.runner_credential(runner_id)
    if row is None or row["revoked_at"] is not None:
        return None
    return row


async def _claim_id(state: ServerState, conn: RunnerConn) -> bool:
    """Register `conn`; if its id is online, only after the old connection failed a ping."""
    while True:
        old = state.registry.online.get(conn.runner_id)
        if old is None:
            state.registry.register(conn)
            return True
        beats = old.beats
        try:
            old.outbox.send_nowait(p.Ping(ts=trio.current_time()))
        except (trio.WouldBlock, trio.ClosedResourceError):
            pass  # a full or closed outbox will not answer either
        with trio.move_on_after(state.reconnect_probe):
            await old.wait_beat(beats)
        if state.registry.online.get(conn.runner_id) is not old:
            continue  # it went away meanwhile: look again
        if old.beats > beats:
            return False  # it answered: that connection is alive
        log.warning("runner %s: a reconnect replaces a connection silent for %.1f s",
                    conn.runner_id, state.reconnect_probe)
        state.turns.link_replaced(old)  # its turns wait for this connection's claims
        state.registry.replace(old, conn, "replaced by a reconnect of the same runner")
        return True


def _in_flight(hello: p.Hello) -> list[dict]:
    """The hello's in-flight entries that name a turn (anything else is ignored).

    Bounded well below the outbox's size, so the Cancels for refused ones always fit;
    a runner runs a handful of turns at once.
    """
    return [e for e in hello.in_flight[:MAX_IN_FLIGHT] if isinstance(e.get("turn_id"), str)]


async def _receive_frames(conn: RunnerConn, transport: Transport, n: trio.Nursery, ended: list[str],
                          draining: set[str]) -> None:
    try:
        while True:
            frame = p.decode(await transport.receive())
            if isinstance(frame, p.Pong):
                conn.alive()
            elif isinstance(frame, (p.TurnEvent, p.TurnCompleted, p.TurnFailed, p.ToolResult, p.HistoryMiss)):
                conn.alive()  # any frame proves it is alive
                if frame.turn_id in draining:  # a refused turn: nothing of it is stored or published
                    if not isinstance(frame, (p.TurnEvent, p.HistoryMiss)):  # its end (TurnCompleted/...)
                        draining.discard(frame.turn_id)
                    continue
                conn.route(frame.turn_id, frame)
            else:
                raise p.ProtocolError(f"a runner may not send {frame.kind!r}")
    except p.ProtocolError as exc:
        ended.append(f"protocol error: {exc.reason}")
        log.warning("runner %s: %s", conn.runner_id, exc.reason)
        with trio.move_on_after(1):
            await transport.close(exc.close_code, exc.reason[:120])
    n.cancel_scope.cancel()


async def _send_frames(transport: Transport, outgoing: trio.MemoryReceiveChannel[p.Frame], n: trio.Nursery,
                       written: Callable[[str], None]) -> None:
    async for frame in outgoing:
        await transport.send(p.encode(frame))
        if isinstance(frame, p.TurnStart):
            mark(f"turn.written:{frame.turn_id}")
            written(frame.session_id)  # the runner has its step: the session's watchers go on (hub.hold)
    # the registry closed the outbox: it dropped this runner (the host saw its process exit)
    n.cancel_scope.cancel()


async def _ping(state: ServerState, conn: RunnerConn, n: trio.Nursery, ended: list[str]) -> None:
    """Ping the runner on the ticks of `ping_interval` (`ticks.py`); end the connection as hung
    once it has been silent for `ping_allowance` intervals.

    Every connection's ticks are the same instants, so an idle server wakes once an interval for
    all its runners, not once per runner at its own phase. A runner heard from within the last
    half interval (a turn's frames) is not pinged: any frame proves it alive, and its next tick
    comes well before the verdict (`_heard_lately`)."""
    interval = state.ping_interval
    while True:
        await sleep_to_tick(interval)
        silent = trio.current_time() - conn.last_pong
        if silent > interval * state.ping_allowance:
            ended.append(f"hung: no answer to pings for {silent:.1f} s")
            n.cancel_scope.cancel()
            return
        if _heard_lately(silent, interval, state.ping_allowance):
            continue
        try:
            conn.outbox.send_nowait(p.Ping(ts=trio.current_time()))
        except trio.WouldBlock:
            pass  # outbox full: the missing pong will tell
        except trio.ClosedResourceError:
            return  # the registry dropped this runner; _send_frames ends the connection


def _heard_lately(silent: float, interval: float, allowance: float) -> bool:
    """Whether a ping at this tick can be skipped: the runner spoke within the last half interval
    (its pong to the last tick's ping, arriving just after it, does not count: an idle runner is
    pinged at every tick), and it would still be within its allowance at the next tick if it said
    nothing meanwhile, when it is pinged. A live runner is never judged hung for a skipped ping."""
    return silent < interval * min(0.5, allowance - 1.0)


async def _close_on_shutdown(state: ServerState, transport: Transport, n: trio.Nursery) -> None:
    await state.shutting_down.wait()
    await transport.close(1001, "server shutting down")  # not 1006 after a 3 s hang (G1)
    n.cancel_scope.cancel()
