"""Waiting for a runner that outlives its link to come back for the turn it runs.

A host daemon's runner, or an explicit one, keeps running when its
websocket drops: it redials and lists its turns in `Hello.in_flight`. So
when such a link drops mid-turn, the turn is expected (`adoption.py`) for
`grace` s rather than dispatched again at once: the model is not called
twice for one attempt just because a connection blinked.

What it guarantees:
- a runner of the in-process host (its process ends with its link) is never
  waited for, nor is any runner when the grace is 0;
- the wait ends as soon as the runner's host reports the process gone, or
  the runner was declared hung: a runner that cannot come back costs no grace;
- a reconnect that replaces a silent connection (`link_replaced`) has the
  old connection's running turns expected before its hello is read.
"""

from __future__ import annotations

from typing import Any

import trio

from ..store import Store
from .adoption import Adoptions
from .registry import LOCAL_HOST, RunnerConn, RunnerRegistry


class Reconnects:
    def __init__(self, store: Store, registry: RunnerRegistry, adoptions: Adoptions, grace: float) -> None:
        self.store = store
        self.registry = registry
        self.adoptions = adoptions
        self.grace = grace

    def expect(self, turn_id: str, runner_id: str) -> bool:
        """Hold a running turn for its runner's reconnect; False when that runner is not waited for.

        Call it with no checkpoint since the loss was seen, so the expectation
        is in place before the runner can redial.
        """
        if self.grace <= 0 or not self._outlives_its_link(runner_id):
            return False
        if not self.adoptions.expects(turn_id):  # (`link_replaced` may have put it in place already)
            turn = self.store.get_turn(turn_id)
            if turn is None or turn["status"] != "running":
                return False
            self.adoptions.expect(turn, grace=self.grace)
        return True

    async def wait(self, turn_id: str, runner_id: str) -> tuple[RunnerConn, trio.MemoryReceiveChannel[Any]] | None:
        """The connection that claimed the expected turn; None when the grace ran out or the runner is gone."""
        claimed = None
        async with trio.open_nursery() as nursery:
            async def gone_for_good() -> None:
                while True:
                    gone = self.registry.departed.get(runner_id)
                    if gone is not None and (gone.reported or gone.cause.startswith("hung")):
                        nursery.cancel_scope.cancel()
                        return
                    await self.registry.wait_changed()

            nursery.start_soon(gone_for_good)
            claimed = await self.adoptions.wait(turn_id)
            nursery.cancel_scope.cancel()
        return claimed

    def link_replaced(self, old: RunnerConn) -> None:
        """A reconnect replaces a silent connection of a runner: its turns are expected on the new one.

        Called before the new connection's hello is read, so its claims find them.
        """
        if self.grace <= 0 or not self._outlives_its_link(old.runner_id):
            return
        for turn_id in list(old.turns):
            turn = self.store.get_turn(turn_id)
            if turn is not None and turn["status"] == "running" and not self.adoptions.expects(turn_id):
                self.adoptions.expect(turn, grace=self.grace)

    def died_with_its_server(self, runner_id: str | None) -> bool:
        """A runner of the in-process host: after a server restart it is gone too (stdin EOF)."""
        row = self.store.runner_credential(runner_id) if runner_id else None
        return row is not None and row["kind"] == "host" and row["host_id"] in (None, LOCAL_HOST)

    def _outlives_its_link(self, runner_id: str) -> bool:
        row = self.store.runner_credential(runner_id)
        return row is not None and (row["kind"] == "explicit" or row["host_id"] not in (None, LOCAL_HOST))
