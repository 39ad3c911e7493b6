"""A fake runner that outlives its connection, as `omnigent/runner/connection.py` does, for MockClock runs.

It speaks the runner protocol over memory channels to the real
`serve_runner` of whichever server incarnation is up (`Dialer`), and keeps
the real runner's rules:

- its turns run across drops; frames it cannot send wait in a buffer and go
  out, in order, right after the next hello is acknowledged;
- every hello reports the turns whose end it has not sent (`in_flight`:
  turn id, attempt, generation);
- `Cancel` cancels a running turn (its end, `cancelled`, is still sent); a
  `TurnStart` for another attempt of a turn it still runs waits for the old
  attempt to end first;
- it redials with capped backoff (`omnigent.runner.redial.Backoff`, seeded),
  and is down for a while when the test drops its link.

`calls` counts model calls per (turn, attempt), so a test can check that no
attempt's model was called twice; each answer's response id names the turn,
attempt and runner, so a test can tell which attempt an answer came from.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

import trio

import protocol as p
from omnigent.runner.redial import Backoff
from protocol import events as ev
from tests.support.fake_runners import assistant_item


class Dialer(Protocol):
    def dial(self, runner: ReconnectingRunner) -> tuple[trio.MemorySendChannel[str], trio.MemoryReceiveChannel[str]] | None:
        """The runner's ends of a new connection to the server that is up, or None (refused)."""


@dataclass
class _Turn:
    start: p.TurnStart | p.ToolStart  # one step of a turn: a model step or a tool step
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: trio.Event = field(default_factory=trio.Event)


class ReconnectingRunner:
    def __init__(self, index: int, runner_id: str, dialer: Dialer, rng: random.Random,
                 model_time: float = 1.0) -> None:
        self.index, self.runner_id, self.dialer = index, runner_id, dialer
        self.rng = rng
        self.model_time = model_time
        self.calls: Counter[tuple[str, int]] = Counter()
        self.sent: list[tuple[float, p.Frame]] = []
        self.hellos: list[tuple[float, list[dict]]] = []
        self._owed: dict[str, _Turn] = {}
        self._running: dict[str, _Turn] = {}
        self._buffer: list[tuple[p.Frame, _Turn | None]] = []
        self._out: trio.MemorySendChannel[str] | None = None
        self._down_until = 0.0
        self._backoff = Backoff(rng=rng)
        self._nursery: trio.Nursery | None = None

    # --- for tests -------------------------------------------------------------

    def drop_link(self, down_for: float) -> None:
        """The network between this runner and the server fails for `down_for` s; the process lives."""
        self._down_until = trio.current_time() + down_for
        if self._out is not None:
            self._out.close()  # the server reads the end; our receive loop ends too (see _session)
            self._out = None

    # --- its life ----------------------------------------------------------------

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            while True:
                if trio.current_time() < self._down_until:
                    await trio.sleep_until(self._down_until)
                ends = self.dialer.dial(self)
                if ends is None:
                    await trio.sleep(self._backoff.next())
                    continue
                if await self._session(*ends):
                    self._backoff.reset()
                await trio.sleep(self._backoff.next())

    async def _session(self, out: trio.MemorySendChannel[str], incoming: trio.MemoryReceiveChannel[str]) -> bool:
        in_flight = [{"turn_id": t.start.turn_id, "attempt": t.start.attempt, "generation": t.start.generation,
                      "step": t.start.step} for t in self._owed.values()]
        try:
            out.send_nowait(p.encode(p.Hello(self.runner_id, 5000 + self.index, p.PROTOCOL_VERSION,
                                             ["fake"], in_flight)))
            ack = p.decode(await incoming.receive())
        except (trio.EndOfChannel, trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        assert isinstance(ack, p.HelloAck), ack
        self.hellos.append((trio.current_time(), in_flight))
        self._out = out
        buffered, self._buffer = self._buffer, []
        for frame, turn in buffered:
            self._send(frame, turn)
        try:
            async for raw in incoming:
                if self._out is not out:
                    break  # dropped by the test
                frame = p.decode(raw)
                if isinstance(frame, p.Ping):
                    self._send(p.Pong(frame.ts), None)
                elif isinstance(frame, (p.TurnStart, p.ToolStart)):
                    self._start(frame)
                elif isinstance(frame, p.Cancel):
                    turn = self._running.get(frame.turn_id)
                    if turn is not None:
                        turn.scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        if self._out is out:
            self._out = None
        return True

    def _send(self, frame: p.Frame, turn: _Turn | None) -> None:
        if self._out is not None:
            try:
                self._out.send_nowait(p.encode(frame))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._out = None
            else:
                self.sent.append((trio.current_time(), frame))
                if turn is not None and isinstance(frame, (p.TurnCompleted, p.TurnFailed, p.ToolResult)) \
                        and self._owed.get(turn.start.turn_id) is turn:
                    del self._owed[turn.start.turn_id]
                return
        if not isinstance(frame, p.Pong):
            self._buffer.append((frame, turn))

    def _start(self, start: p.TurnStart | p.ToolStart) -> None:
        old = self._owed.get(start.turn_id)
        if old is not None and (old.start.attempt, old.start.step, old.start.kind) == (
                start.attempt, start.step, start.kind):
            return  # a duplicate
        turn = _Turn(start)
        self._running[start.turn_id] = self._owed[start.turn_id] = turn
        assert self._nursery is not None
        self._nursery.start_soon(self._turn, turn, old)

    async def _turn(self, turn: _Turn, superseded: _Turn | None) -> None:
        start = turn.start
        if superseded is not None:
            superseded.scope.cancel()
            await superseded.done.wait()
        tid, attempt = start.turn_id, start.attempt
        end: p.Frame
        with turn.scope:
            self.calls[(tid, attempt, start.step, start.kind)] += 1  # the model call (or the tool run)
            await trio.sleep(self.model_time * self.rng.uniform(0.2, 1.0))
            if isinstance(start, p.TurnStart):
                self._send(p.TurnEvent(tid, {"type": ev.TEXT_DELTA, "turn_id": tid,
                                             "delta": f"{tid[-6:]}/{attempt}"}), turn)
            await trio.sleep(self.model_time * self.rng.uniform(0.2, 1.0))
        if isinstance(start, p.ToolStart):  # a read-only tool: its contents, or cancelled
            status = "cancelled" if turn.scope.cancelled_caught else "completed"
            end = p.ToolResult(tid, start.call_id, status, f"contents for {tid[-6:]}/{attempt}")
        elif turn.scope.cancelled_caught:
            end = p.TurnFailed(tid, "cancelled", "cancelled")
        elif start.step == 0:  # every turn's first model step reads a file
            call = {"type": "function_call", "id": f"fc_{tid[-6:]}", "call_id": f"call_{tid[-6:]}",
                    "name": "read_file", "arguments": '{"path": "a.txt"}', "status": "completed"}
            end = p.TurnCompleted(tid, f"resp_{tid[-6:]}_{attempt}_{self.index}_s0", [call])
        else:
            text = f"answer {tid[-6:]}/{attempt} from #{self.index}"
            end = p.TurnCompleted(tid, f"resp_{tid[-6:]}_{attempt}_{self.index}", [assistant_item(text)])
        if self._running.get(tid) is turn:
            del self._running[tid]
        self._send(end, turn)
        turn.done.set()


def memory_pipe() -> tuple[tuple[trio.MemorySendChannel[str], trio.MemoryReceiveChannel[str]],
                           tuple[trio.MemorySendChannel[str], trio.MemoryReceiveChannel[str]]]:
    """(runner's ends, server's ends) of one connection: text frames both ways."""
    to_server, from_runner = trio.open_memory_channel[str](math.inf)
    to_runner, from_server = trio.open_memory_channel[str](math.inf)
    return (to_server, from_server), (to_runner, from_runner)
