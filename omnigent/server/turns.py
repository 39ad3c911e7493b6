"""Runs each session's turns, one at a time, on the session's runner.

A user message is already stored (or pending, see `Store.queue_message`) when
it gets here. Every session has one worker task that takes its queued turns
in order, waits for the conversation's claim (one turn at a time across
processes, `claims.py`), finds (or binds) an online runner and runs the turn's
steps on it (`agent_loop.py`: model steps and tool steps, each stored before
the next), relaying the runner's events to the hub.

Which runner that is, and where a lost runner's sessions go, is decided in
`placement.py`; what a turn's end writes (with its events, in one
transaction) is `outcomes.py`'s; a runner that outlives its dropped link is
waited for in `reconnects.py`; the steps of one attempt are `agent_loop.py`'s
and whether a tool call may run is `approval_waits.py`'s. This module is the
dispatch: the worker, its attempts, their losses and adoptions.

If the runner is lost mid-turn the turn is marked interrupted and dispatched
again (the loop goes on from its stored steps: a completed step is never
asked again), until it has cost `max_losses` runners: then it fails with
`runner_lost` and is not dispatched again. Re-dispatch is paced so that one
turn loses at most `loss_budget` runners in any `loss_window` s: a poison turn
(one that kills every runner it reaches) thus stays inside the host's restart
intensity (more than 5 restarts of a slot in 30 s gives up) and cannot take
every other session down with it, while the usual case, a second kill hitting
the runner that took over, is retried at once.

Ownership: every attempt is dispatched under the session's ownership
generation (bumped by every rebinding, `store/conversations.py`) and carries
it in `TurnStart`. A session rebound while a turn runs has moved on: the old
runner's further frames for it are refused (nothing stored or published) and
the turn is dispatched again on the new binding.

After a server restart (`take_over`, `omnigent server` only), the dead
predecessor's running turns wait `adopt_grace` s for their runner to
reconnect and claim them (`adoption.py`); the worker then follows the
adopted attempt as if it had dispatched it. Only a turn nobody claims is
dispatched again. Taking those turns up, and a dropped link's turn claimed
on its reconnect, are `turn_takeovers.py`'s (a mixin of `TurnService`).

A session's worker lives while the session has turns queued: it ends when
the queue is empty, and the next `submit` starts another.
"""

from __future__ import annotations

import logging
from functools import partial
import os
import sqlite3
from typing import Any, NamedTuple

import trio

import protocol as p
from protocol import events as ev

from ..store import Store
from .adoption import Adoptions
from .claims import ClaimLost, Claims
from .agent_loop import MOVED, AgentLoop, LoopTurn
from .approval_waits import ApprovalWaits, ToolGate, effective_mode
from .hub import EventHub
from .outcomes import Outcomes
from .placement import NoRunner, Placement
from .reconnects import Reconnects
from .turn_takeovers import TakeoversMixin
from .registry import LOCAL_HOST, RunnerConn, RunnerRegistry

__all__ = ["LOCAL_HOST", "NoRunner", "TurnService"]  # NoRunner and LOCAL_HOST: their home before

log = logging.getLogger("omnigent.server.turns")


class _Started(NamedTuple):
    """A turn's first attempt, begun with its message (`queue_message`), for its worker to follow:
    the turn's row as started, the runner it went to, the session's row it was started from, and
    the step begun with it (`AgentLoop.begin_first_step`)."""

    turn: dict[str, Any]
    conn: RunnerConn
    conv: dict[str, Any]
    begun: dict[str, Any] | None


class TurnService(TakeoversMixin):
    """The turns of every session of this server: one worker per session (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        hub: EventHub,
        registry: RunnerRegistry,
        nursery: trio.Nursery,
        *,
        runner_wait: float = 30.0,
        max_losses: int = 5,
        max_attempts: int | None = None,
        loss_window: float = 30.0,
        loss_budget: int = 3,
        claims: Claims | None = None,
        adopt_grace: float = 10.0,
        reconnect_grace: float = 5.0,
    ) -> None:
        self.store = store
        self.hub = hub
        self.registry = registry
        self._nursery = nursery
        self.max_losses = max_attempts if max_attempts is not None else max_losses  # old name kept
        self.loss_window = loss_window
        self.loss_budget = loss_budget
        self.claims = claims or Claims(store)
        self.claims.renew_in(nursery)
        self._serving: set[str] = set()  # sessions with a worker (started or running)
        self._active: dict[str, LoopTurn] = {}  # session -> the attempt its loop runs now
        self._retrying: set[str] = set()  # sessions whose interrupted turn waits for a runner
        self._waiting: dict[str, trio.CancelScope] = {}  # sessions whose turn waits without a runner
        self.adoptions = Adoptions(store, adopt_grace)
        self.placement = Placement(store, hub, registry, self.claims, self.adoptions, nursery,
                                   runner_wait=runner_wait, retrying=self._retries_after)
        self._outcomes = Outcomes(store, hub)
        self._reconnects = Reconnects(store, registry, self.adoptions, reconnect_grace)  # a dropped link, mid-turn
        self._moved: set[str] = set()  # sessions rebound while a turn ran: its runner's frames are refused
        self._workers: dict[str, tuple[trio.CancelScope, trio.Event]] = {}  # session -> its worker (scope, done)
        self._started: dict[str, _Started] = {}  # sessions whose new turn's attempt began with its message
        self.waits = ApprovalWaits()
        self.gate = ToolGate(store, hub, self.waits)
        self.loop = AgentLoop(store, hub, self._outcomes, self.gate, self._has_moved, self._moved.discard,
                              self.claims.release_with_end)

    # --- entry points -------------------------------------------------------

    def queue_message(self, session_id: str, item: dict[str, Any], *,
                      approval_timeout: float | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """What a posted user message does, in one transaction: the message, its queued turn (with
        the conversation's claim when it is idle, `Claims.queue_message`) and `input.consumed`;
        `submit` follows. Returns (the item, the turn).

        When the claim came with the message (no turn of the session queued, running or
        claimed, here or elsewhere) and the session's runner is online, the turn's first attempt
        starts in the same transaction, as the worker would start it at once (`_attempt`): one
        write transaction a turn fewer, and the worker goes straight to the TurnStart. That holds
        whether the session has no worker (idle) or one still leaving its last turn (a client
        that posts as soon as it has the answer): that worker takes the attempt next. A crash
        after it leaves a running turn, as one just after an attempt's start always did (it is
        interrupted and retried)."""
        started = None
        with self.hub.transaction(session_id) as tx:  # the message and its events commit together
            item, turn, claimed = self.claims.queue_message(session_id, item, approval_timeout=approval_timeout)
            tx.publish(ev.INPUT_CONSUMED, item=item, turn_id=turn["id"])
            placed = self._placed_at_once(session_id) if claimed else None
            if placed is not None:
                conn, conv = placed
                turn, begun = self._start_attempt(tx, session_id, turn["id"], conn, conv)
                started = _Started(turn, conn, conv, begun)
        if started is not None:  # committed: the session's worker follows that attempt
            self._started[session_id] = started
            self.hub.hold(session_id)  # its watchers read these events once the runner has the step
        return item, turn

    def _placed_at_once(self, session_id: str) -> tuple[RunnerConn, dict[str, Any]] | None:
        """Where `queue_message` starts the new turn's attempt (its runner and the session's row), or
        None when that is the worker's to decide. Asked only when the claim came with the message
        (otherwise the turn waits behind another, here or in another process).

        A worker of the session may be here: the claim coming with the message means its last
        turn has ended, and released the claim with its end (`Claims.release_with_end`). It is
        then between that end and reading `_started` (leaving `Claims.renewed`), with nothing of
        that turn left to write; it follows this attempt next, as a new worker would."""
        if session_id in self._active or session_id in self._started or self.adoptions.expects_session(session_id):
            return None  # a turn of it runs here (so it holds the claim), or one is started already
        # placement's own look, without its waiting: the session's runner, or one bound now (a first turn)
        return self.placement.at_once(session_id, self.store.get_conversation(session_id, counts=False))

    def submit(self, session_id: str) -> None:
        """A turn was queued for this session: start its worker, unless one runs (it reads the
        queue again after each turn)."""
        if session_id not in self._serving:
            self._serving.add(session_id)
            # its watchers read the turn's first events once the runner has the step (hub.hold)
            self.hub.hold(session_id)
            self._nursery.start_soon(self._session_worker, session_id, name=f"turns:{session_id}")

    async def end_session(self, session_id: str) -> None:
        """The session is being deleted (server/sessions.py): its turn is cancelled (the runner
        told, an approval wait ended) and its worker stopped, so that nothing more of it is
        written once its rows are gone. Returns when the worker has stopped."""
        await self.interrupt(session_id)
        worker = self._workers.get(session_id)
        if worker is not None:
            scope, done = worker
            scope.cancel()
            await done.wait()

    def status(self, session_id: str) -> str:
        active = self._active.get(session_id)
        if active is not None and active.waiting_for is not None:
            return "waiting"  # for a person's answer to an approval
        if active is not None or session_id in self._started or self.store.next_queued_turn(session_id):
            return "running"
        return "idle"

    def active_runner(self, session_id: str) -> str | None:
        active = self._active.get(session_id)
        return active.runner_id if active else None

    def approval_answered(self, session_id: str, approval_id: str) -> None:
        """An answer to an approval was stored (the API route): publish it and wake the waiting loop."""
        self.gate.answered(session_id, approval_id)

    async def interrupt(self, session_id: str) -> bool:
        active = self._active.get(session_id)
        if active is None:
            waiting = self._waiting.get(session_id)  # behind another process, or a paced retry
            if waiting is not None:
                waiting.cancel()
            return waiting is not None
        active.cancel_requested = True  # no further step is taken
        if active.approval_scope is not None:  # waiting for a person: the approval is cancelled
            active.approval_scope.cancel()
            return True
        try:
            await active.conn.send(p.Cancel(turn_id=active.turn_id))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return False
        return True

    def session_moved(self, session_id: str) -> None:
        """The session was rebound by hand: a turn running on its old runner is refused from now on."""
        self.registry.notify_changed()  # a turn waiting for a runner re-reads the binding
        active = self._active.get(session_id)
        if active is not None:
            conv = self.store.get_conversation(session_id, counts=False) or {}
            if conv.get("runner_id") != active.runner_id:
                self._moved.add(session_id)
                active.conn.route(active.turn_id, MOVED)  # wakes the follower, which refuses the rest

    # --- runners coming and going (placement.py) ------------------------------

    def runner_left(self, runner_id: str) -> None:
        self.placement.runner_left(runner_id)

    def runner_joined(self, conn: RunnerConn) -> None:
        """A new runner (with the others online) adopts the sessions of runners lost while none could."""
        self.placement.runner_joined(conn)

    def _retries_after(self, session_id: str, old: str) -> bool:
        """Whether the session's turn is dispatched again once it is rebound off `old`."""
        return session_id in self._retrying or self.active_runner(session_id) == old

    # --- the per-session worker ----------------------------------------------

    async def _session_worker(self, session_id: str) -> None:
        """`_worker`, stoppable by `end_session`; a session deleted under it (by another process
        sharing the store, say) stops it quietly instead of taking the server down."""
        done = trio.Event()
        with trio.CancelScope() as scope:
            self._workers[session_id] = (scope, done)
            try:
                await self._worker(session_id)
            except Exception:
                if self.store.get_conversation(session_id) is not None:
                    raise
                log.info("session %s was deleted: its turns stop", session_id)
            finally:
                self.hub.release(session_id)  # whatever became of the dispatch
                del self._workers[session_id]
                self._serving.discard(session_id)
                self._retrying.discard(session_id)
                self._moved.discard(session_id)
                self._started.pop(session_id, None)
                done.set()

    async def _worker(self, session_id: str) -> None:
        while True:
            started = self._started.pop(session_id, None)  # its attempt began with its message
            turn = (started.turn if started is not None else
                    self._adopted_turn(session_id) or self.store.next_own_queued_turn(session_id, os.getpid()))
            if turn is None:
                # Idle: the worker ends and the next `submit` starts another. No checkpoint since
                # the read, so no turn queued meanwhile is missed; and a server that has served
                # many sessions holds no task (~3.4 KB each) for each idle one.
                return
            try:
                # A started attempt holds the claim (its message's transaction took it, and said so
                # to `queue_message`), and its message was appended at once: there is
                # nothing to wait for or place, so neither is read again.
                if started is None:
                    # a claim held elsewhere: the wait may be long, the watchers need not wait with it
                    claimed = self.claims.acquire(session_id, turn["id"], on_wait=partial(self.hub.release, session_id))
                    if not await self._wait(session_id, claimed):
                        self._cancelled(session_id, turn["id"])
                        continue
                # history is read only inside the claim: it has the answer this turn waited for
                async with self.claims.renewed(session_id, turn["id"], on_cancel_request=partial(
                        self._nursery.start_soon, self.interrupt, session_id)):
                    if started is None:
                        self.store.place_pending(session_id, turn["input_item_id"])
                    if self.adoptions.expects(turn["id"]):  # (never a turn started with its message)
                        await self._recover(session_id, turn)
                    else:
                        await self._run_turn(session_id, turn, started=started)
            except ClaimLost:  # its message went to the other process's turn, which answers it
                self._fail(session_id, turn["id"], "overtaken",
                           "this process stalled and another one took over the conversation; "
                           "its turn has this message")
            except sqlite3.Error as exc:  # a full or failing disk: the turn fails, the server stays up
                log.error("turn %s: the store failed: %s", turn["id"], exc)
                self._outcomes.fail(session_id, turn["id"], "store_error",
                                    f"cannot write store: {self.store.path}: {exc}")
            except Exception:  # one broken turn must not stop the session's queue
                if self.store.get_conversation(session_id) is None:
                    return  # deleted meanwhile: nothing of it is left to end
                log.exception("turn %s crashed the dispatcher", turn["id"])
                self._fail(session_id, turn["id"], "internal_error", "the server failed to run this turn")
            await _after_woken()  # the turn's end is published: its watchers write it before the next read

    def _fail(self, session_id: str, turn_id: str, code: str, message: str) -> None:
        """End the turn failed, its open steps closed first (no tool left "running")."""
        self._close_steps(session_id, turn_id, "failed")
        self._outcomes.fail(session_id, turn_id, code, message)

    def _cancelled(self, session_id: str, turn_id: str) -> None:
        self._close_steps(session_id, turn_id, "cancelled")
        self._outcomes.cancelled(session_id, turn_id)

    def _close_steps(self, session_id: str, turn_id: str, status: str) -> None:
        try:
            self.loop.close_open_steps(session_id, turn_id, status)
        except (sqlite3.Error, KeyError, TypeError) as exc:  # the end itself must still be stored
            log.error("turn %s: could not close its open steps: %s", turn_id, exc)

    async def _run_turn(self, session_id: str, turn: dict[str, Any], losses: list[float] | None = None, *,
                        started: _Started | None = None) -> None:
        """Run the turn's attempts until one ends it. `started`: its first attempt, begun with its
        message (`queue_message`): followed on that runner, gone meanwhile or not (then it is lost)."""
        turn_id = turn["id"]
        losses = [] if losses is None else losses  # when each runner was lost under this turn
        while True:
            if started is not None:
                first, started = started, None  # followed once: a retry places the turn as ever
                conn = first.conn
                outcome = await self._follow(session_id, turn_id, conn, conn.open_turn(turn_id), adopted=False,
                                             conv=first.conv, turn=first.turn, begun=first.begun)
            elif not await self._wait(session_id, self._pace(losses)):
                self._retrying.discard(session_id)
                self._cancelled(session_id, turn_id)
                return
            else:
                try:
                    conn, placed = await self.placement.runner_for(session_id)
                except NoRunner as exc:
                    self._retrying.discard(session_id)
                    self._fail(session_id, turn_id, exc.code, str(exc))
                    return
                self._retrying.discard(session_id)
                outcome = await self._attempt(session_id, turn_id, conn, placed)
            while outcome == "lost":  # a runner that outlives its link may come back for it
                claimed = await self._reclaim(session_id, turn_id, conn)
                if claimed == "cancelled":
                    self._cancelled(session_id, turn_id)
                    return
                if claimed is None:
                    break
                conn, frames = claimed
                outcome = await self._follow(session_id, turn_id, conn, frames)
            if outcome == "moved":  # rebound by hand: the new binding runs it, at no loss
                self.store.finish_turn(turn_id, "interrupted", error="the session was moved to another runner")
                continue
            if outcome != "lost":
                return
            losses.append(trio.current_time())
            reason = f"runner {conn.runner_id} was lost"
            ended = self._outcomes.interrupted(session_id, turn_id, reason)
            if len(losses) >= self.max_losses:
                break
            self._retrying.add(session_id)
            if ended:
                self.hub.publish(session_id, ev.TURN_RETRIED, turn_id=turn_id, attempt=ended["attempt"] + 1)
        self._retrying.discard(session_id)
        self._fail(session_id, turn_id, "runner_lost",
                   f"the runner was lost {len(losses)} times while running this turn; "
                   f"it is not dispatched again (OMNIGENT_TURN_LOSSES={self.max_losses})")

    async def _wait(self, session_id: str, waiting: Any) -> bool:
        """Run a wait (for the claim, or a paced re-dispatch) that `interrupt` may end: False if it did."""
        with trio.CancelScope() as scope:
            self._waiting[session_id] = scope
            try:
                await waiting
            finally:
                del self._waiting[session_id]
        return not scope.cancelled_caught

    async def _pace(self, losses: list[float]) -> None:
        """Hold a re-dispatch while this turn lost `loss_budget` runners in the last `loss_window` s."""
        while True:
            now = trio.current_time()
            recent = [t for t in losses if t + self.loss_window > now]  # as sleep_until compares
            if len(recent) < self.loss_budget:
                return
            log.warning("a turn lost %d runners within %g s: its next attempt waits %.1f s",
                        len(recent), self.loss_window, recent[0] + self.loss_window - trio.current_time())
            await trio.sleep_until(recent[0] + self.loss_window)

    async def _attempt(self, session_id: str, turn_id: str, conn: RunnerConn,
                       conv: dict[str, Any] | None = None) -> str:
        """Dispatch one attempt to `conn` and run the turn's steps on it: completed, failed, lost or moved.

        `conv`: the session's row as placement read it, current (None reads it)."""
        if conv is None:
            conv = self.store.get_conversation(session_id, counts=False) or {}  # gone: fail cleanly
        with self.hub.transaction(session_id) as tx:  # the attempt and its events commit together (events)
            turn, begun = self._start_attempt(tx, session_id, turn_id, conn, conv)
        # the rows just read and written go on as they are: nothing ran in between (no checkpoint)
        return await self._follow(session_id, turn_id, conn, conn.open_turn(turn_id), adopted=False,
                                  conv=conv, turn=turn, begun=begun)

    def _start_attempt(self, tx: Any, session_id: str, turn_id: str, conn: RunnerConn,
                       conv: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """An attempt's start inside the transaction `tx`: the turn running on `conn` under the session's
        generation, a fresh turn's first step with it, and their events; the turn's row as started
        and the step begun (None: not a fresh turn)."""
        turn = self.store.start_turn(turn_id, conn.runner_id, os.getpid(), generation=int(conv.get("generation") or 0))
        begun = self.loop.begin_first_step(session_id, turn)  # a fresh turn's model step 0 with it
        tx.publish(ev.SESSION_STATUS, status="running", turn_id=turn_id)
        tx.publish(ev.RESPONSE_CREATED, turn_id=turn_id, attempt=turn["attempt"], runner_id=conn.runner_id)
        return turn, begun

    async def _follow(self, session_id: str, turn_id: str, conn: RunnerConn,
                      frames: trio.MemoryReceiveChannel[Any], *, adopted: bool = True,
                      conv: dict[str, Any] | None = None, turn: dict[str, Any] | None = None,
                      begun: dict[str, Any] | None = None) -> str:
        """Run the turn's steps on `conn` (an attempt dispatched here, or one its runner claimed).

        `conv` and `turn`: their rows as the caller has them, current (read or written with no
        checkpoint since); None reads them. `begun`: the step this attempt's start began
        (`_start_attempt`), the loop's first plan starting from it."""
        if conv is None:
            conv = self.store.get_conversation(session_id, counts=False) or {}
        spec = self.store.session_spec(session_id) if conv else {}
        if turn is None:
            turn = self.store.get_turn(turn_id) or {}
        host_policy = self.registry.host_permissions(self.registry.host_of(conn.runner_id))
        loop_turn = LoopTurn(
            session_id, turn_id, turn.get("input_item_id"), int(turn.get("attempt") or 0),
            int(turn.get("generation") or 0), conn, frames, spec, conv,
            effective_mode(conv.get("permission_mode"), spec.get("permissions"), host_policy),
            turn.get("approval_timeout"), self.hub, adopted=adopted, begun=begun)
        self._active[session_id] = loop_turn
        try:
            return await self.loop.run(loop_turn)
        finally:
            conn.close_turn(turn_id)
            self._active.pop(session_id, None)

    def _has_moved(self, session_id: str, turn_id: str, generation: int | None = None) -> bool:
        """The session's generation is no longer the one this attempt runs under (rebound elsewhere).

        `generation`: the attempt's (`LoopTurn.generation`), which is the turn row's for as long as
        the attempt runs (only its worker, here, starts another); None reads it from the row."""
        if session_id in self._moved:
            return True
        current = self.store.generation_of(session_id)
        if generation is None:
            generation = int((self.store.get_turn(turn_id) or {}).get("generation") or 0)
        return current != generation


async def _after_woken() -> None:
    """Return once every task woken before the call has run its step. trio runs a batch of
    woken tasks in either order, so one checkpoint may still come first; the second comes
    after that batch."""
    await trio.lowlevel.checkpoint()
    await trio.lowlevel.checkpoint()
