"""Runs each session's turns, one at a time, on the session's runner.

A user message is already stored when it gets here. Every session has one
worker task that takes its queued turns in order, finds (or binds) an online
runner, sends it the whole history, relays the runner's events to the hub and
stores the answer once per turn. If the runner is lost mid-turn the turn is
marked interrupted and dispatched again, up to `max_attempts`.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import trio

import protocol as p
from protocol import events as ev

from ..store import Store
from .hub import EventHub
from .registry import RunnerConn, RunnerRegistry

log = logging.getLogger("omnigent.server.turns")


class NoRunner(Exception):
    pass


class TurnService:
    def __init__(
        self,
        store: Store,
        hub: EventHub,
        registry: RunnerRegistry,
        nursery: trio.Nursery,
        *,
        runner_wait: float = 30.0,
        max_attempts: int = 2,
    ) -> None:
        self.store = store
        self.hub = hub
        self.registry = registry
        self._nursery = nursery
        self.runner_wait = runner_wait
        self.max_attempts = max_attempts
        self._wake: dict[str, trio.Event] = {}
        self._active: dict[str, tuple[str, RunnerConn]] = {}  # session -> (turn id, runner)
        self._retrying: set[str] = set()  # sessions whose interrupted turn waits for a runner
        self._unadopted: set[str] = set()  # lost runners whose sessions wait for the next runner
        self.exit_report_wait = 0.2

    # --- entry points -------------------------------------------------------

    def submit(self, session_id: str) -> None:
        """A turn was queued for this session: make sure its worker sees it."""
        wake = self._wake.get(session_id)
        if wake is None:
            self._wake[session_id] = trio.Event()
            self._nursery.start_soon(self._worker, session_id, name=f"turns:{session_id}")
        else:
            wake.set()

    def status(self, session_id: str) -> str:
        if session_id in self._active or self.store.next_queued_turn(session_id):
            return "running"
        return "idle"

    def active_runner(self, session_id: str) -> str | None:
        active = self._active.get(session_id)
        return active[1].runner_id if active else None

    async def interrupt(self, session_id: str) -> bool:
        active = self._active.get(session_id)
        if active is None:
            return False
        turn_id, conn = active
        try:
            await conn.send(p.Cancel(turn_id=turn_id))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return False
        return True

    # --- runners coming and going ---------------------------------------------

    def runner_left(self, runner_id: str) -> None:
        self._nursery.start_soon(self._handle_loss, runner_id)

    def runner_joined(self, conn: RunnerConn) -> None:
        """A new runner adopts the sessions of runners lost while none could take them."""
        for old in list(self._unadopted):
            self._rebind(old, conn)
        self._unadopted.clear()

    async def _handle_loss(self, runner_id: str) -> None:
        # the host's exit report (code or signal) says more than a dropped socket, within ms
        with trio.move_on_after(self.exit_report_wait):
            while not self._departure_reported(runner_id):
                await self.registry.wait_changed()
        gone = self.registry.departed.get(runner_id)
        cause = gone.cause if gone else "disconnected"
        for session_id in self.store.conversations_for_runner(runner_id):
            self.hub.publish(session_id, ev.RUNNER_LOST, runner_id=runner_id, cause=cause)
        others = list(self.registry.online.values())
        if others:  # e.g. the warm spare: take over now, the supervisor refills in the background
            self._rebind(runner_id, others[0])
        else:
            self._unadopted.add(runner_id)

    def _departure_reported(self, runner_id: str) -> bool:
        gone = self.registry.departed.get(runner_id)
        return gone is None or gone.reported or runner_id in self.registry.online

    def _rebind(self, old: str, conn: RunnerConn) -> None:
        gone = self.registry.departed.get(old)
        moved = self.store.rebind_runner(old, conn.runner_id)
        for session_id in moved:
            self.hub.publish(
                session_id, ev.RUNNER_REBOUND, old_runner_id=old, new_runner_id=conn.runner_id,
                cause=gone.cause if gone else "disconnected",
                downtime=round(trio.current_time() - gone.at, 3) if gone else 0.0,
                retrying=session_id in self._retrying or self.active_runner(session_id) == old,
            )
        if moved:
            self.registry.notify_changed()  # workers waiting in _runner_for re-read their binding

    # --- the per-session worker ----------------------------------------------

    async def _worker(self, session_id: str) -> None:
        while True:
            self._wake[session_id] = trio.Event()
            turn = self.store.next_queued_turn(session_id)
            if turn is None:
                await self._wake[session_id].wait()
                continue
            try:
                await self._run_turn(session_id, turn)
            except Exception:  # one broken turn must not stop the session's queue
                log.exception("turn %s crashed the dispatcher", turn["id"])
                self._fail(session_id, turn["id"], "internal_error", "the server failed to run this turn")

    async def _run_turn(self, session_id: str, turn: dict[str, Any]) -> None:
        turn_id = turn["id"]
        for _ in range(self.max_attempts):
            try:
                conn = await self._runner_for(session_id)
            except NoRunner as exc:
                self._retrying.discard(session_id)
                self._fail(session_id, turn_id, "runner_unavailable", str(exc))
                return
            self._retrying.discard(session_id)
            outcome = await self._attempt(session_id, turn_id, conn)
            if outcome != "lost":
                return
            self.store.finish_turn(turn_id, "interrupted", error=f"runner {conn.runner_id} was lost")
            self._retrying.add(session_id)
        self._retrying.discard(session_id)
        self._fail(session_id, turn_id, "runner_lost",
                   f"the runner was lost {self.max_attempts} times while running this turn")

    async def _attempt(self, session_id: str, turn_id: str, conn: RunnerConn) -> str:
        conv = self.store.get_conversation(session_id) or {}  # gone: run with no spec, fail cleanly
        agent = self.store.get_agent(conv["agent_id"]) if conv.get("agent_id") else None
        spec = dict(agent["spec"]) if agent else {}
        turn = self.store.start_turn(turn_id, conn.runner_id, os.getpid())
        history = self._history(session_id, turn["input_item_id"])
        model = conv.get("model_override") or spec.get("model") or ""
        frames = conn.open_turn(turn_id)
        self._active[session_id] = (turn_id, conn)
        try:
            self.hub.publish(session_id, ev.SESSION_STATUS, status="running", turn_id=turn_id)
            self.hub.publish(session_id, ev.RESPONSE_CREATED, turn_id=turn_id, attempt=turn["attempt"],
                             runner_id=conn.runner_id)
            try:
                await conn.send(p.TurnStart(
                    turn_id=turn_id, session_id=session_id, attempt=turn["attempt"], agent=spec,
                    input=history, model=model,
                    reasoning_effort=conv.get("reasoning_effort") or spec.get("reasoning_effort"),
                ))
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return "lost"
            async for frame in frames:
                if isinstance(frame, p.TurnEvent):
                    self._relay(session_id, turn_id, frame.event)
                elif isinstance(frame, p.TurnCompleted):
                    self._complete(session_id, turn_id, frame)
                    return "completed"
                elif isinstance(frame, p.TurnFailed):
                    if frame.code == "cancelled":
                        self.store.finish_turn(turn_id, "cancelled", error="cancelled")
                        self.hub.publish(session_id, ev.CANCELLED, turn_id=turn_id)
                        self.hub.publish(session_id, ev.SESSION_STATUS, status="idle")
                    else:
                        self._fail(session_id, turn_id, frame.code, frame.message)
                    return "failed"
            return "lost"
        finally:
            conn.close_turn(turn_id)
            self._active.pop(session_id, None)

    # --- helpers -------------------------------------------------------------

    async def _runner_for(self, session_id: str) -> RunnerConn:
        """The session's runner if online, else bind one (compare-and-set), waiting a bounded time."""
        with trio.move_on_after(self.runner_wait):
            while True:
                conv = self.store.get_conversation(session_id)
                bound = conv.get("runner_id") if conv else None
                if bound and bound in self.registry.online:
                    return self.registry.online[bound]
                # a runner lost in this server's life is replaced by runner_left/joined
                # (with the notices); only unbound or stale bindings are taken here
                adoptable = bound is None or bound not in self.registry.departed
                for conn in list(self.registry.online.values()) if adoptable else ():
                    if self.store.bind_runner(session_id, conn.runner_id, expected=bound):
                        return conn
                    break  # someone else rebound it: re-read
                else:
                    if self.registry.gave_up:
                        raise NoRunner(f"runners cannot stay up: {self.registry.gave_up}")
                    await self.registry.wait_changed()
        raise NoRunner(f"no runner came online within {self.runner_wait:g} s")

    def _history(self, session_id: str, input_item_id: str) -> list[dict[str, Any]]:
        history = []
        for item in self.store.list_items(session_id):
            history.append(item)
            if item["id"] == input_item_id:
                break
        return history

    def _relay(self, session_id: str, turn_id: str, event: dict[str, Any]) -> None:
        try:
            event = p.decode_event({**event, "turn_id": turn_id})
        except p.ProtocolError as exc:
            log.warning("dropping bad event from runner: %s", exc.reason)
            return
        fields = {k: v for k, v in event.items() if k not in ("type", "sequence_number", "session_id")}
        self.hub.publish(session_id, event["type"], **fields)

    def _complete(self, session_id: str, turn_id: str, frame: p.TurnCompleted) -> None:
        self.store.append_turn_output(session_id, turn_id, frame.output, frame.response_id)
        self.store.finish_turn(turn_id, "completed")
        response = {"id": frame.response_id, "object": "response", "status": "completed",
                    "output": frame.output, "usage": frame.usage}
        self.hub.publish(session_id, ev.COMPLETED, turn_id=turn_id, response=response)
        self.hub.publish(session_id, ev.SESSION_STATUS, status="idle")

    def _fail(self, session_id: str, turn_id: str, code: str, message: str) -> None:
        self.store.finish_turn(turn_id, "failed", error=message)
        error = {"code": code, "message": message}
        self.hub.publish(session_id, ev.FAILED, turn_id=turn_id, error=error)
        self.hub.publish(session_id, ev.SESSION_STATUS, status="failed", error=error)
