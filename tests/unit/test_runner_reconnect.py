"""The runner across dropped connections, on a MockClock with a fake websocket (issue 8 §2).

A fake server end stands in for the websocket: it can refuse dials (server
down), accept them, and close a connection with any code. The runner's
harness is a fake whose model call waits on an event, so a turn is still
running while its connection is gone.
"""

from __future__ import annotations

import math
import random
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import trio
import trio.testing
from trio_websocket import CloseReason, ConnectionClosed, HandshakeError

import protocol as p
from omnigent.runner.main import EXIT_ERROR, Config, Runner
from omnigent.runner.redial import Backoff


class FakeWs:
    """One connection: the runner's side (`send_message`, `get_message`, `aclose`) and the server's."""

    def __init__(self) -> None:
        self._to_runner, self._runner_in = trio.open_memory_channel[str](math.inf)
        self._to_server, self.server_in = trio.open_memory_channel[str](math.inf)
        self.reason: CloseReason | None = None

    async def send_message(self, data: str) -> None:
        await trio.lowlevel.checkpoint()
        if self.reason is not None:
            raise ConnectionClosed(self.reason)
        self._to_server.send_nowait(data)

    async def get_message(self) -> str:
        try:
            return await self._runner_in.receive()
        except trio.EndOfChannel:
            raise ConnectionClosed(self.reason) from None

    async def aclose(self, code: int = 1000, reason: str | None = None) -> None:
        await trio.lowlevel.checkpoint()
        if self.reason is None:
            self.close(code, reason)

    # --- the server's side
    def close(self, code: int, reason: str | None = "") -> None:
        self.reason = CloseReason(code, reason)
        self._to_runner.close()
        self._to_server.close()

    def send(self, frame: p.Frame) -> None:
        self._to_runner.send_nowait(p.encode(frame))

    async def recv(self) -> p.Frame:
        return p.decode(await self.server_in.receive())

    async def handshake(self) -> p.Hello:
        hello = await self.recv()
        assert isinstance(hello, p.Hello)
        self.send(p.HelloAck(ping_interval=1.0))
        return hello


class FakeServer:
    def __init__(self) -> None:
        self.up = True
        self.dials: list[float] = []
        self._send, self._accepted = trio.open_memory_channel[FakeWs](math.inf)

    @asynccontextmanager
    async def dial(self, url: str, headers: Any):
        self.dials.append(trio.current_time())
        await trio.lowlevel.checkpoint()
        if not self.up:
            raise HandshakeError() from OSError("connection refused")
        ws = FakeWs()
        self._send.send_nowait(ws)
        yield ws

    async def accept(self) -> FakeWs:
        return await self._accepted.receive()


class FakeModel:
    """The harness: a delta at once, then the answer when `release` is set; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = trio.Event()

    async def execute(self, pool: Any, turn: p.TurnStart, emit: Any, environ: Any) -> p.Frame:
        self.calls += 1
        await emit(p.TurnEvent(turn.turn_id, {"type": "response.output_text.delta", "delta": "par"}))
        await self.release.wait()
        return p.TurnCompleted(turn.turn_id, "resp_1", [{"type": "message", "role": "assistant",
                                                         "content": [{"type": "output_text", "text": "done"}]}])


def _runner(server: FakeServer, model: FakeModel) -> Runner:
    runner = Runner(Config("http://server", "runner_a", "secret"), {}, dial=server.dial, rng=random.Random(7))
    runner._harness = SimpleNamespace(execute=model.execute)  # type: ignore[assignment]
    return runner


def _turn(attempt: int = 1, generation: int = 3) -> p.TurnStart:
    return p.TurnStart(turn_id="turn_1", session_id="conv_1", attempt=attempt, agent={}, input=[],
                       model="m", generation=generation)


async def test_a_turn_survives_a_drop_and_its_frames_arrive_on_the_next_connection(autojump_clock):
    server, model = FakeServer(), FakeModel()
    runner = _runner(server, model)
    async with trio.open_nursery() as nursery:
        result: list[int] = []

        async def run() -> None:
            result.append(await runner.connect_and_serve())

        nursery.start_soon(run)
        first = await server.accept()
        assert (await first.handshake()).in_flight == []
        first.send(_turn())
        assert isinstance(await first.recv(), p.TurnEvent)
        server.up = False
        dropped_at = trio.current_time()
        first.close(1006, "abnormal")
        while len(server.dials) < 5:  # it keeps dialing while the server is down
            await trio.sleep(0.01)
        model.release.set()  # the model answers while no connection is up: the end is held
        await trio.sleep(1)
        server.up = True
        second = await server.accept()
        hello = await second.handshake()
        assert hello.in_flight == [{"turn_id": "turn_1", "attempt": 1, "generation": 3, "step": 0, "kind": "model"}]
        end = await second.recv()
        assert isinstance(end, p.TurnCompleted) and end.turn_id == "turn_1"
        assert model.calls == 1
        # the delays doubled from 0.1 s, each within ±25 %
        gaps = [b - a for a, b in zip([dropped_at, *server.dials[1:]], server.dials[1:])]
        for n, gap in enumerate(gaps[:4]):
            assert 0.1 * 2 ** n * 0.75 - 1e-9 <= gap <= 0.1 * 2 ** n * 1.25 + 1e-9, gaps
        # told it is refused (the credential was revoked): it ends, and says so once
        second.close(4003, "wrong or missing secret for this runner id")
    assert result == [EXIT_ERROR]


async def test_a_reconnect_hello_reports_nothing_once_the_end_was_sent(autojump_clock):
    server, model = FakeServer(), FakeModel()
    model.release.set()
    runner = _runner(server, model)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runner.connect_and_serve)
        first = await server.accept()
        await first.handshake()
        first.send(_turn())
        while not isinstance(await first.recv(), p.TurnCompleted):
            pass
        await trio.testing.wait_all_tasks_blocked()
        first.close(1001, "server shutting down")
        second = await server.accept()
        assert (await second.handshake()).in_flight == []
        nursery.cancel_scope.cancel()


async def test_a_new_attempt_of_a_running_turn_waits_for_the_old_one_to_end(autojump_clock):
    server, model = FakeServer(), FakeModel()
    runner = _runner(server, model)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runner.connect_and_serve)
        ws = await server.accept()
        await ws.handshake()
        ws.send(_turn(attempt=1))
        await ws.recv()  # its delta
        ws.send(p.Cancel("turn_1"))  # the server refused attempt 1 and dispatches attempt 2
        ws.send(_turn(attempt=2, generation=4))
        ended = await ws.recv()
        assert isinstance(ended, p.TurnFailed) and ended.code == "cancelled"  # attempt 1's end first
        assert isinstance(await ws.recv(), p.TurnEvent)  # then attempt 2 runs
        assert model.calls == 2
        nursery.cancel_scope.cancel()


def test_backoff_doubles_to_its_cap_with_jitter_and_resets():
    backoff = Backoff(first=0.1, cap=5.0, jitter=0.25, rng=random.Random(1))
    delays = [backoff.next() for _ in range(12)]
    nominal = [min(0.1 * 2 ** n, 5.0) for n in range(12)]
    assert all(0.75 * n <= d <= 1.25 * n for d, n in zip(delays, nominal))
    assert max(delays) <= 5.0 * 1.25 and delays[-1] >= 5.0 * 0.75
    backoff.reset()
    assert backoff.next() <= 0.125
