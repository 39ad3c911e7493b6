"""One runner's connection to the server, independent of the transport.

The websocket route adapts quart's websocket to `Transport`; tests drive the
same code over memory channels under a MockClock. The connection: a valid
hello first, then frames routed to the turns waiting on them, pings on a
timer and a hang verdict when pongs stop, 1001 on shutdown.
"""

from __future__ import annotations

import logging
from typing import Protocol

import trio

import protocol as p

from .registry import RunnerConn
from .state import ServerState

log = logging.getLogger("omnigent.server.runners")


class Transport(Protocol):
    async def receive(self) -> str | bytes: ...   # raises on close: the connection ends
    async def send(self, text: str) -> None: ...
    async def close(self, code: int, reason: str) -> None: ...


async def serve_runner(state: ServerState, runner_id: str, transport: Transport) -> None:
    try:
        with trio.fail_after(state.hello_timeout):
            hello = p.decode(await transport.receive())
        if not isinstance(hello, p.Hello) or hello.runner_id != runner_id:
            raise p.ProtocolError("first frame must be a hello for this runner id")
    except p.ProtocolError as exc:
        await transport.close(exc.close_code, exc.reason[:120])
        return
    except trio.TooSlowError:
        await transport.close(4008, "no hello")
        return
    outbox, outgoing = trio.open_memory_channel[p.Frame](256)
    conn = RunnerConn(hello.runner_id, hello.pid, list(hello.harnesses), outbox)
    ended: list[str] = []  # why the connection ended; the first reason wins
    state.registry.register(conn)
    state.host_events.runner_online(runner_id)
    state.turns.runner_joined(conn)
    try:
        await transport.send(p.encode(p.HelloAck(ping_interval=state.ping_interval)))
        async with trio.open_nursery() as n:
            n.start_soon(_close_on_shutdown, state, transport, n)
            n.start_soon(_send_frames, transport, outgoing, n)
            n.start_soon(_ping, state, conn, n, ended)
            n.start_soon(_receive_frames, conn, transport, n, ended)
    finally:
        cause = ended[0] if ended else "disconnected"
        if cause.startswith("hung"):
            state.host_events.kill_runner(runner_id, cause)
        state.registry.unregister(conn, cause)
        state.turns.runner_left(runner_id)


async def _receive_frames(conn: RunnerConn, transport: Transport, n: trio.Nursery, ended: list[str]) -> None:
    try:
        while True:
            frame = p.decode(await transport.receive())
            if isinstance(frame, p.Pong):
                conn.last_pong = trio.current_time()
            elif isinstance(frame, (p.TurnEvent, p.TurnCompleted, p.TurnFailed)):
                conn.last_pong = trio.current_time()  # any frame proves it is alive
                conn.route(frame.turn_id, frame)
            else:
                raise p.ProtocolError(f"a runner may not send {frame.kind!r}")
    except p.ProtocolError as exc:
        ended.append(f"protocol error: {exc.reason}")
        log.warning("runner %s: %s", conn.runner_id, exc.reason)
        with trio.move_on_after(1):
            await transport.close(exc.close_code, exc.reason[:120])
    n.cancel_scope.cancel()


async def _send_frames(transport: Transport, outgoing: trio.MemoryReceiveChannel[p.Frame], n: trio.Nursery) -> None:
    async for frame in outgoing:
        await transport.send(p.encode(frame))
    # the registry closed the outbox: it dropped this runner (the host saw its process exit)
    n.cancel_scope.cancel()


async def _ping(state: ServerState, conn: RunnerConn, n: trio.Nursery, ended: list[str]) -> None:
    while True:
        await trio.sleep(state.ping_interval)
        silent = trio.current_time() - conn.last_pong
        if silent > state.ping_interval * state.ping_allowance:
            ended.append(f"hung: no answer to pings for {silent:.1f} s")
            n.cancel_scope.cancel()
            return
        try:
            conn.outbox.send_nowait(p.Ping(ts=trio.current_time()))
        except trio.WouldBlock:
            pass  # outbox full: the missing pong will tell
        except trio.ClosedResourceError:
            return  # the registry dropped this runner; _send_frames ends the connection


async def _close_on_shutdown(state: ServerState, transport: Transport, n: trio.Nursery) -> None:
    await state.shutting_down.wait()
    await transport.close(1001, "server shutting down")  # not 1006 after a 3 s hang (G1)
    n.cancel_scope.cancel()
