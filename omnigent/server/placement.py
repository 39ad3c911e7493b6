"""Where a session's turn runs: binding sessions to runners, and moving them off a lost one.

Placement spreads sessions: an unbound session, and each session of a lost
runner, goes to the least loaded placeable runner (fewest sessions bound,
then fewest turns running, then the longest online), so one kill hits few.
A session only goes where it may run (`registry.may_serve`: its host, its
workspace); one that has nowhere to go waits for its host's next runner.

What it guarantees:
- a binding changes by compare-and-set only (`Store.bind_runner(expected=...)`),
  so two processes sharing a store never both rebind a session;
- a session whose claim a live other process holds, or whose turn waits for
  its runner to reconnect (`adoption.py`), keeps its binding;
- `runner_for` waits a bounded time (`runner_wait`, and for a session pinned
  to a host at least that host's grace), then raises `NoRunner`; `at_once`
  is its first look without the wait (a turn started in its message's
  transaction binds there, by the same rules).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import trio

from protocol import events as ev

from ..store import Store
from .adoption import Adoptions
from .claims import Claims
from .hub import EventHub
from .registry import Affinity, RunnerConn, RunnerRegistry

# a placeable runner's load: (sessions bound, turns running, connected at, the runner)
_Load = tuple[int, int, float, RunnerConn]
_RACED: Literal["raced"] = "raced"  # `_look`: another process rebound the session meanwhile


class NoRunner(Exception):
    def __init__(self, message: str, code: str = "runner_unavailable") -> None:
        super().__init__(message)
        self.code = code  # host_unavailable: the session's host is offline past its grace


class Placement:
    """Binds sessions to runners and spreads a lost runner's sessions (see the module docstring).

    `retrying(session_id, old_runner_id)` says whether the session's turn will be
    dispatched again on its new runner (it is announced in `runner.rebound`).
    """

    def __init__(self, store: Store, hub: EventHub, registry: RunnerRegistry, claims: Claims,
                 adoptions: Adoptions, nursery: trio.Nursery, *, runner_wait: float,
                 retrying: Callable[[str, str], bool]) -> None:
        self.store = store
        self.hub = hub
        self.registry = registry
        self.claims = claims
        self.adoptions = adoptions
        self._nursery = nursery
        self.runner_wait = runner_wait
        self.exit_report_wait = 0.2
        self._retrying = retrying
        self._unadopted: set[str] = set()  # lost runners whose sessions wait for the next runner
        self._handled: set[str] = set()  # lost runners whose sessions were moved (left ones may be taken)

    # --- runners coming and going ---------------------------------------------

    def runner_left(self, runner_id: str) -> None:
        self._nursery.start_soon(self._handle_loss, runner_id)

    def runner_joined(self, conn: RunnerConn) -> None:
        """A new runner (with the others online) adopts the sessions of runners lost while none could."""
        unadopted, self._unadopted = list(self._unadopted), set()
        for old in unadopted:
            self._spread(old)  # puts back a runner whose sessions still have nowhere to go (affinity)

    async def _handle_loss(self, runner_id: str) -> None:
        # the host's exit report (code or signal) says more than a dropped socket, within ms
        with trio.move_on_after(self.exit_report_wait):
            while not self._departure_reported(runner_id):
                await self.registry.wait_changed()
        gone = self.registry.departed.get(runner_id)
        cause = gone.cause if gone else "disconnected"
        for session_id in self.store.conversations_for_runner(runner_id):
            self.hub.publish(session_id, ev.RUNNER_LOST, runner_id=runner_id, cause=cause)
        if self.registry.placeable():  # e.g. the warm spare: take over now, the supervisor refills
            self._spread(runner_id)
        else:
            self._unadopted.add(runner_id)

    def _departure_reported(self, runner_id: str) -> bool:
        gone = self.registry.departed.get(runner_id)
        return gone is None or gone.reported or runner_id in self.registry.online

    def _spread(self, old: str) -> None:
        """Move the lost runner's sessions over the placeable runners, each to the least loaded.

        A session whose claim a live other process holds is left alone: that
        process runs its turn on a runner of its own.
        """
        gone = self.registry.departed.get(old)
        loads = self._loads()
        moved = False
        for session_id in self.store.conversations_for_runner(old):
            if not loads or self.claims.held_elsewhere(session_id) or self.adoptions.expects_session(session_id):
                continue  # (a turn waiting for its runner to reconnect keeps the binding, and generation)
            mine = self._eligible(session_id, loads)  # hosts: only where the session may run
            if not mine:
                self._unadopted.add(old)  # its host's next runner takes it (runner_joined)
                continue
            conn = _least_loaded(mine)
            with self.hub.transaction(session_id) as tx:  # the binding and its notice at once (events)
                if not self.store.bind_runner(session_id, conn.runner_id, expected=old):
                    continue  # rebound meanwhile (another process holding its claim)
                tx.publish(
                    ev.RUNNER_REBOUND, old_runner_id=old, new_runner_id=conn.runner_id,
                    cause=gone.cause if gone else "disconnected",
                    downtime=round(trio.current_time() - gone.at, 3) if gone else 0.0,
                    retrying=self._retrying(session_id, old),
                )
            bound, running, at, _ = loads[conn.runner_id]
            loads[conn.runner_id] = (bound + 1, running, at, conn)
            moved = True
        self._handled.add(old)
        if moved:
            self.registry.notify_changed()  # workers waiting in runner_for re-read their binding

    def _affinity(self, session_id: str) -> Affinity:
        conv = self.store.get_conversation(session_id, counts=False) or {}
        return Affinity(self.store.conversation_host(session_id), conv.get("workspace"))

    def _eligible(self, session_id: str, loads: dict[str, _Load]) -> dict[str, _Load]:
        """The part of `loads` this session may be placed on (registry.may_serve)."""
        affinity = self._affinity(session_id)
        return {rid: load for rid, load in loads.items() if self.registry.may_serve(rid, affinity)}

    def _loads(self) -> dict[str, _Load]:
        """Each placeable runner's load: (sessions bound, turns running, connected at, the runner)."""
        conns = self.registry.placeable()
        bound = self.store.runner_loads(c.runner_id for c in conns)
        return {c.runner_id: (bound[c.runner_id], len(c.turns), c.connected_at, c) for c in conns}

    # --- finding a session's runner -------------------------------------------

    async def runner_for(self, session_id: str) -> tuple[RunnerConn, dict[str, Any] | None]:
        """The session's runner if online, else bind the least loaded (compare-and-set), waiting a bounded time.

        With it, the session's row as read to find a runner already bound, current (no checkpoint
        since: the caller's attempt need not read it again); None when it bound one (the row changed).

        A session pinned to a host whose link is down waits at least until that host's grace
        ends; then it fails with `host_unavailable` (server/registry.py, affinity).
        """
        with trio.move_on_after(self.runner_wait):
            return await self._find_runner(session_id)
        host_id = self._affinity(session_id).host_id
        grace_end = self.registry.grace_end(host_id)
        if grace_end is not None and grace_end > trio.current_time():
            with trio.move_on_at(grace_end):
                return await self._find_runner(session_id)
        if host_id is not None and not self.registry.host_online(host_id):
            raise NoRunner(f"host {host_id} is unavailable: its link is down and no runner of it "
                           f"came online within {self.runner_wait:g} s", "host_unavailable")
        raise NoRunner(f"no runner came online within {self.runner_wait:g} s")

    def bound_online(self, conv: dict[str, Any] | None) -> RunnerConn | None:
        """The runner the session's row `conv` is bound to, if it is online now (no binding is made)."""
        bound = conv.get("runner_id") if conv else None
        return self.registry.online.get(bound) if bound else None

    def at_once(self, session_id: str, conv: dict[str, Any] | None) -> tuple[RunnerConn, dict[str, Any]] | None:
        """`runner_for` without its waiting, for a turn started with its message: the runner the session's
        row `conv` (current) is bound to if online, else the least loaded placeable one, bound now (in the
        caller's transaction, if any), with the row as it is then. None where `runner_for` would wait or
        read again (no runner it may take, or another process rebound it meanwhile)."""
        found = self._look(session_id, conv) if conv is not None else None
        if found is None or found == _RACED:
            return None
        conn, after = found
        return conn, after if after is not None else (self.store.get_conversation(session_id, counts=False) or {})

    def _look(self, session_id: str,
              conv: dict[str, Any] | None) -> tuple[RunnerConn, dict[str, Any] | None] | Literal["raced"] | None:
        """One look for the session's runner, given its row `conv` as read now: (its runner, `conv`) when it
        is bound and online; (a runner, None) when one was bound now (the row changed); `_RACED` when the
        compare-and-set lost to another process (read again); None when none may be taken now."""
        online = self.bound_online(conv)
        if online is not None:
            return online, conv
        bound = conv.get("runner_id") if conv else None
        # a runner lost in this server's life is replaced by runner_left/joined
        # (with the notices); only unbound, stale or left-behind bindings are taken here
        adoptable = bound is None or bound not in self.registry.departed or bound in self._handled
        adoptable = adoptable and not self.registry.launching(bound)  # a host is starting it for us
        loads = self._eligible(session_id, self._loads()) if adoptable else {}
        if not loads:
            return None
        conn = _least_loaded(loads)
        if self.store.bind_runner(session_id, conn.runner_id, expected=bound):
            return conn, None
        return _RACED

    async def _find_runner(self, session_id: str) -> tuple[RunnerConn, dict[str, Any] | None]:
        while True:
            found = self._look(session_id, self.store.get_conversation(session_id, counts=False))
            if found == _RACED:
                continue  # someone else rebound it: re-read
            if found is not None:
                return found
            if self.registry.gave_up:
                raise NoRunner(f"runners cannot stay up: {self.registry.gave_up}")
            self.hub.release(session_id)  # the dispatch waits for a runner: its watchers need not (hub.hold)
            await self.registry.wait_changed()


def _least_loaded(loads: dict[str, _Load]) -> RunnerConn:
    """Fewest sessions bound, then fewest turns running, then the longest online."""
    return min(loads.values(), key=lambda load: load[:3])[3]
