"""Which runners are online right now, and the routes to their websockets.

The registry is the one place that knows a runner is connected: the runner
websocket handler registers it after a valid hello and unregisters it when the
socket ends. Turns in flight on a runner are tracked here so that losing the
runner ends them at once (their channels close) instead of leaving them hung.

An online id is never taken over silently: `register` refuses it, and only
`replace` (after the old connection failed a liveness ping) swaps the
connection of an id. Explicit runners (registered by a client, not launched
by a host) are online like any other but `placeable` leaves them out, so
automatic placement and rebinding never pick them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import trio

from protocol import Frame


@dataclass
class RunnerConn:
    runner_id: str
    pid: int
    harnesses: list[str]
    outbox: trio.MemorySendChannel[Frame]
    connected_at: float = field(default_factory=trio.current_time)
    last_pong: float = field(default_factory=trio.current_time)
    turns: dict[str, trio.MemorySendChannel[Any]] = field(default_factory=dict)
    explicit: bool = False   # registered by a client: serves only sessions bound to it by hand
    beats: int = 0           # frames received so far: a liveness probe waits for this to move
    gone: bool = False       # dropped from the registry
    # turns it was told to cancel (refused, or moved away): their frames are dropped up to their end
    draining: set[str] = field(default_factory=set)
    _beat: trio.Event = field(default_factory=trio.Event, repr=False)

    def alive(self) -> None:
        """A frame came in: the runner is alive now."""
        self.last_pong = trio.current_time()
        self.beats += 1
        self._beat.set()
        self._beat = trio.Event()

    async def wait_beat(self, after: int) -> None:
        """Until a frame arrives after `after` beats (or the connection is dropped)."""
        while self.beats <= after and not self.gone:
            await self._beat.wait()

    async def send(self, frame: Frame) -> None:
        await self.outbox.send(frame)

    def open_turn(self, turn_id: str) -> trio.MemoryReceiveChannel[Any]:
        send, recv = trio.open_memory_channel[Any](math.inf)
        self.turns[turn_id] = send
        return recv

    def close_turn(self, turn_id: str) -> None:
        ch = self.turns.pop(turn_id, None)
        if ch is not None:
            ch.close()

    def route(self, turn_id: str, frame: Frame) -> bool:
        ch = self.turns.get(turn_id)
        if ch is None:
            return False  # late frame of a turn nobody waits for any more
        ch.send_nowait(frame)
        return True


@dataclass(frozen=True)
class Departure:
    """Why a runner went offline, kept for status queries and notices."""

    runner_id: str
    cause: str          # "disconnected", "exited with code 3", "killed by SIGKILL", "hung: ..."
    at: float
    error: str | None = None  # crash report (exit reason + log tail) when the host sent one

    @property
    def reported(self) -> bool:
        return self.error is not None


class AlreadyOnline(Exception):
    """`register` of an id that already has a live connection."""


class RunnerRegistry:
    def __init__(self) -> None:
        self.online: dict[str, RunnerConn] = {}
        self.departed: dict[str, Departure] = {}
        self.pids: dict[str, int] = {}
        self.gave_up: str | None = None  # why the host stopped replacing runners, with the log tail
        self._changed = trio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def placeable(self) -> list[RunnerConn]:
        """The online runners automatic placement and rebinding may choose: host-launched ones."""
        return [conn for conn in self.online.values() if not conn.explicit]

    def register(self, conn: RunnerConn) -> None:
        if conn.runner_id in self.online:
            raise AlreadyOnline(conn.runner_id)
        self.online[conn.runner_id] = conn
        self.pids[conn.runner_id] = conn.pid
        self.departed.pop(conn.runner_id, None)
        self._notify()

    def replace(self, old: RunnerConn, new: RunnerConn, cause: str) -> None:
        """Swap the connection of an online id (the old one failed a liveness ping)."""
        self.unregister(old, cause)
        self.register(new)

    def unregister(self, conn: RunnerConn, cause: str) -> None:
        if self.online.get(conn.runner_id) is not conn:
            return
        del self.online[conn.runner_id]
        for turn_id in list(conn.turns):
            conn.close_turn(turn_id)
        conn.outbox.close()
        conn.gone = True
        conn._beat.set()  # a liveness probe waiting on it ends
        self.departed.setdefault(conn.runner_id, Departure(conn.runner_id, cause, trio.current_time()))
        self._notify()

    def record_exit(self, runner_id: str, cause: str, error: str | None) -> None:
        """The host saw the process end: a better cause than a dropped socket.

        A hang verdict of the server's own stays first: that exit is the kill it asked for.
        """
        prior = self.departed.get(runner_id)
        if prior is not None and prior.cause.startswith("hung"):
            cause = f"{prior.cause}; {cause}"
            error = f"{prior.cause}; {error}" if error else cause
        at = prior.at if prior is not None else trio.current_time()  # downtime counts from the loss
        self.departed[runner_id] = Departure(runner_id, cause, at, error)
        conn = self.online.get(runner_id)
        if conn is not None:
            self.unregister(conn, cause)
        else:
            self._notify()

    def give_up(self, report: str) -> None:
        self.gave_up = report
        self._notify()

    def notify_changed(self) -> None:
        """Wake `wait_changed` for a change made elsewhere (sessions moved to another runner)."""
        self._notify()

    async def wait_changed(self) -> None:
        await self._changed.wait()

    def status(self, runner_id: str) -> dict[str, Any]:
        conn = self.online.get(runner_id)
        body: dict[str, Any] = {"runner_id": runner_id, "online": conn is not None,
                                "pid": self.pids.get(runner_id)}
        gone = self.departed.get(runner_id)
        if conn is None and gone is not None:
            body["error"] = gone.error or gone.cause
        return body
