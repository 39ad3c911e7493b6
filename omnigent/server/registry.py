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

Hosts: the registry also knows which host launched each runner (the
`RunnerCredential` frame arrives on that host's link) and which host links
are up (`HostConn`, one per host id; the in-process host is `host_local`).
Each host's tool policy (`HostHello.permissions`, `host_permissions`) caps
the effective permission mode of the sessions its runners serve
(`approval_waits.py`). Placement honours a session's affinity (`Affinity`): a session with a host
goes only to runners of that host or of hosts declaring a workspace root
that contains its workspace; a session with only a workspace to the
in-process host or such hosts; a session with neither to any runner. A host
whose link dropped keeps `host_grace` seconds to come back before the
sessions pinned to it count as unavailable (`grace_end`).
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import trio

from protocol import Frame

from .. import channels
from ..link.memory import LinkEnd

LOCAL_HOST = "host_local"  # the in-process host of `omnigent run` / `omnigent server --runners N`


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
    features: frozenset[str] = frozenset()  # what its hello announced (protocol/history.py: history_cache)
    # session -> what this connection was last sent of its history (server/history.py SentHistory)
    histories: dict[str, Any] = field(default_factory=dict)
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
        """Queue `frame` for the link's writer: as `outbox.send`, without its schedule point while
        the outbox has room (a TurnStart is the worker's last act before it waits for the answer,
        and that yield was a task step of every turn); a full outbox still waits."""
        await channels.send(self.outbox, frame)

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


class Affinity(NamedTuple):
    """Where a session may run: its host and its workspace (either may be None)."""

    host_id: str | None = None
    workspace: str | None = None


@dataclass
class HostConn:
    """One live host link: what the server posts to the host goes to `link`."""

    host_id: str
    link: LinkEnd
    generation: int
    name: str = ""
    pid: int = 0
    capacity: int = 0
    connected_at: float = field(default_factory=trio.current_time)
    last_pong: float = field(default_factory=trio.current_time)
    kicked: trio.Event = field(default_factory=trio.Event, repr=False)
    kick_code: int = 0
    kick_reason: str = ""
    permissions: str = "ask"  # the most its runners' tools may do (`omnigent host --permissions`)

    def kick(self, code: int, reason: str) -> None:
        """Close this link (replaced: 4009, revoked: 4003); its serve loop does the closing."""
        if not self.kicked.is_set():
            self.kick_code, self.kick_reason = code, reason
            self.kicked.set()


def within(path: str, root: str) -> bool:
    """`path` is `root` or below it (both absolute; compared lexically, normalized)."""
    path, root = posixpath.normpath(path), posixpath.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


class RunnerRegistry:
    def __init__(self, *, host_grace: float = 10.0,
                 host_lookup: Callable[[str], tuple[bool, str | None]] | None = None) -> None:
        self.online: dict[str, RunnerConn] = {}
        self.departed: dict[str, Departure] = {}
        self.pids: dict[str, int] = {}
        self.gave_up: str | None = None  # why the host stopped replacing runners, with the log tail
        self.host_grace = host_grace
        self.hosts: dict[str, HostConn] = {}        # host links up now, by host id
        self.runner_host: dict[str, str] = {}       # runner id -> the host that launched it
        self.host_roots: dict[str, list[str]] = {}  # workspace roots each host declared (kept offline)
        self.host_left_at: dict[str, float] = {}    # when each host's link last dropped
        self.host_policy: dict[str, str] = {}       # each host's declared tool policy (kept offline)
        # the in-process host's tool policy: `omnigent run --permission-mode`; None trusts the
        # session's own mode (a local run's YAML is this machine's own). `omnigent server`: ask.
        self.local_permissions: str | None = "ask"
        # (known, host id) of a runner's stored credential: after a server restart a runner may
        # dial back before its host's link does, and must still count as that host's
        self._host_lookup = host_lookup
        self._changed = trio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def placeable(self, affinity: Affinity | None = None) -> list[RunnerConn]:
        """The online runners automatic placement and rebinding may choose: host-launched ones,
        and with `affinity`, only those that may serve that session."""
        return [conn for conn in self.online.values()
                if not conn.explicit and (affinity is None or self.may_serve(conn.runner_id, affinity))]

    # --- hosts ------------------------------------------------------------------

    def host_of(self, runner_id: str) -> str:
        """The host that launched `runner_id`; one not announced by any link counts as in-process."""
        host_id = self.runner_host.get(runner_id)
        if host_id is None and self._host_lookup is not None:
            known, stored = self._host_lookup(runner_id)
            if known:
                host_id = self.runner_host[runner_id] = stored or LOCAL_HOST
        return host_id or LOCAL_HOST

    def may_serve(self, runner_id: str, affinity: Affinity) -> bool:
        host_id, workspace = affinity
        if host_id is None and workspace is None:
            return True
        owner = self.host_of(runner_id)
        if owner == (host_id or LOCAL_HOST):  # a workspace without a host is on the server's machine
            return True
        return workspace is not None and any(within(workspace, root) for root in self.host_roots.get(owner, ()))

    def host_runners(self, host_id: str) -> list[str]:
        """Ids of the runners online now that this host launched."""
        return [rid for rid in self.online if self.host_of(rid) == host_id]

    def host_permissions(self, host_id: str) -> str | None:
        """The most `host_id` lets its runners' tools do; None: the session's own mode decides."""
        if host_id == LOCAL_HOST:
            return self.local_permissions
        return self.host_policy.get(host_id, "ask")

    def host_online(self, host_id: str) -> bool:
        return host_id == LOCAL_HOST or host_id in self.hosts

    def attach_host(self, conn: HostConn, workspace_roots: list[str]) -> HostConn | None:
        """`conn` is now the link of its host; returns the link it replaces (the caller kicks it)."""
        old = self.hosts.get(conn.host_id)
        self.hosts[conn.host_id] = conn
        self.host_roots[conn.host_id] = list(workspace_roots)
        self.host_policy[conn.host_id] = conn.permissions
        self.host_left_at.pop(conn.host_id, None)
        self._notify()
        return old

    def detach_host(self, conn: HostConn) -> None:
        """That link ended; a newer link of the same host stays."""
        if self.hosts.get(conn.host_id) is conn:
            del self.hosts[conn.host_id]
            self.host_left_at[conn.host_id] = trio.current_time()
            self._notify()

    def grace_end(self, host_id: str | None) -> float | None:
        """When the grace of an offline host ends (None: online, or never seen in this server's life)."""
        if host_id is None or self.host_online(host_id):
            return None
        left = self.host_left_at.get(host_id)
        return None if left is None else left + self.host_grace

    def launching(self, runner_id: str | None) -> bool:
        """Launched by a host (it said so) but not online yet, and not gone."""
        return (runner_id is not None and runner_id in self.pids and runner_id not in self.online
                and runner_id not in self.departed)

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
