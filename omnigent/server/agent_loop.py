"""The agent loop: a turn as model steps and tool steps, each committed before the next.

A turn (one user message) is steps numbered 0, 1, 2 ... (`turn_steps`). A
*model step* is one `TurnStart(step=n)` to the runner, answered by
`TurnCompleted` or `TurnFailed`; a *tool step* is one `ToolStart(step=n)` for
one `function_call` of the model step before it, answered by `ToolResult`.
The runner is stateless: it runs one step at a time and never decides what
comes next (what it keeps, each session's last history, is a verified cache:
a step to it may carry only the new items, `_send_turn_start`). The loop reads what to do next from the store alone
(`_next`), so a re-dispatch after a loss, an adoption after a server
restart and a `/retry` all go on from the same place.

Commit points (each one store transaction with its events, `hub.transaction`):
- a model step's output (text and `function_call` items) with the step row
  completed and its usage (`finish_model_step`), before any of its tools runs;
- a tool step's `function_call_output` with the step row (`finish_tool_step`),
  with `session.tool.completed`, before the next model call.

Recovery, from the first unfinished stored step (one `session.step.recovered` each):

| stored step                         | what the loop does                                     |
| ----------------------------------- | ------------------------------------------------------ |
| model step running                  | dispatched again, same history (byte-identical input)  |
| read-only tool running              | run again                                              |
| side-effecting tool running         | stored `interrupted` with the output captured so far;  |
|                                     | the step's later calls stored `not_run`; next model    |
| tool waiting, approval of this life | the same approval is waited for (nothing re-run)       |
| tool waiting, older approval        | that one `expired`, asked again (new id)               |

Whatever ends a turn early (failed, cancelled, out of runners) closes its
open steps (`close_open_steps`) so nothing is left "running": every
`function_call` gets exactly one output item.

This module is `AgentLoop` itself: the loop, its model steps and the
following of what the runner sends; the tool steps and `close_open_steps`
are `loop_tools.py` (a mixin of it), the turn attempt it runs (`LoopTurn`)
and its plan of what comes next `loop_turn.py`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

import protocol as p
from protocol import events as ev
from protocol.history import HISTORY_CACHE, ZERO

from ..config.timeline import mark
from ..store import Store
from .approval_waits import SIDE_EFFECTING, ToolGate
from .histories import Built, Histories, SentHistory, sent_base
from .hub import EventHub
from .loop_tools import INTERRUPTED, NOT_RUN_CANCELLED, NOT_RUN_INTERRUPTED, NOT_RUN_LIMIT, ToolStepsMixin
from .loop_turn import OPEN, LoopTurn, _pending, _Plan
from .outcomes import Outcomes

log = logging.getLogger("omnigent.server.turns")

MOVED: Any = object()  # put on a followed turn's route when its session is rebound by hand
DEFAULT_MAX_STEPS = 50


class AgentLoop(ToolStepsMixin):
    """Runs a turn's steps on one runner until the turn ends or the attempt does (see the docstring).

    `run` returns "completed", "failed", "cancelled" (all stored), "lost" (the
    runner went; nothing stored for the open step) or "moved" (the session was
    rebound; the old runner told to cancel).
    """

    def __init__(self, store: Store, hub: EventHub, outcomes: Outcomes, gate: ToolGate,
                 has_moved: Callable[[str, str, int], bool], moved_done: Callable[[str], None],
                 release_claim: Callable[[str], None] | None = None) -> None:
        self.store = store
        self.hub = hub
        self.outcomes = outcomes
        self.gate = gate
        self._has_moved = has_moved
        self._moved_done = moved_done
        self._release_claim = release_claim  # inside a completed turn's last transaction (claims.py)
        self._captured: dict[tuple[str, str], list[str]] = {}  # (turn, call) -> output, this server's life
        self.histories = Histories()  # each session's history, built from what is new since its last step

    # --- the loop -------------------------------------------------------------------

    async def run(self, t: LoopTurn) -> str:
        steps: list[dict[str, Any]] | None = None
        items: list[dict[str, Any]] | None = None
        if t.adopted:
            outcome = await self._follow_open_step(t)
            if outcome is not None:
                return outcome
        elif t.begun is not None:  # a fresh turn: its one step begun with its attempt, no item yet
            steps, items = [t.begun], []
        else:
            steps = self._recover(t)
        while True:
            plan = self._plan(t, steps, items)
            steps = items = None  # read again for every later step: each one wrote
            kind, n, call, later = plan.kind, plan.step, plan.call, plan.later
            if t.cancel_requested:
                self._not_run(t, n, ([call] if call else []) + later, NOT_RUN_CANCELLED)
                self.outcomes.cancelled(t.session_id, t.turn_id)
                return "cancelled"
            if kind == "done":
                self._complete(t, None)
                return "completed"
            if kind == "model":
                outcome = await self._model_step(t, n, plan)
            else:
                assert call is not None  # _next gives a "tool" step its call
                outcome = await self._tool_step(t, n, call, later)
            if outcome is not None:
                return outcome

    def _next(self, t: LoopTurn) -> tuple[str, int, dict[str, Any] | None, list[dict[str, Any]]]:
        """What comes next, from the store: ("model"|"tool"|"done", step, call, the step's later calls)."""
        plan = self._plan(t)
        return plan.kind, plan.step, plan.call, plan.later

    def _plan(self, t: Any, steps: list[dict[str, Any]] | None = None,
              items: list[dict[str, Any]] | None = None) -> _Plan:
        """`_next`, with what it read. `steps` and `items`: the turn's steps and items as the caller
        has them, current (read or written with no checkpoint since)."""
        if steps is None:
            steps = self.store.steps(t.turn_id)
        last = steps[-1] if steps else None
        if items is None:
            items = self.turn_items(t.session_id, t.turn_id)
        pending = _pending(items)
        if last is not None and last["status"] in OPEN:
            if last["kind"] == "model":
                return _Plan("model", last["step"], None, [], items, last)
            call = next((c for c in pending if c.get("call_id") == last["call_id"]), None)
            if call is None:
                call = {"type": "function_call", "call_id": last["call_id"], "name": last["tool"],
                        "arguments": last["arguments"] or ""}
            return _Plan("tool", last["step"], call, [c for c in pending if c is not call], items, last)
        n = last["step"] + 1 if last is not None else 0
        if pending:
            return _Plan("tool", n, pending[0], pending[1:], items, None)
        if last is not None and last["kind"] == "model" and last["status"] == "completed":
            return _Plan("done", n, None, [], items, None)
        return _Plan("model", n, None, [], items, None)

    def begin_first_step(self, session_id: str, turn: dict[str, Any]) -> dict[str, Any] | None:
        """Begin a fresh turn's first step (a model step: it has no step and no item yet) inside the
        caller's transaction, the one that starts its attempt; its row, or None for any other turn.

        What the loop would do first anyway, with no checkpoint in between (`run` finds the step
        begun for this attempt and begins nothing): one write transaction fewer per turn. Given
        to the attempt's `LoopTurn.begun`, the row is also what the loop's first plan needs to
        read: the turn's only step, and no item."""
        if turn.get("step") is not None or turn.get("output_persisted"):
            return None  # steps or stored output (a turn of an older release): `_next` decides
        return self.store.begin_step(session_id, turn["id"], 0, "model", attempt=int(turn.get("attempt") or 0))

    def _recover(self, t: LoopTurn) -> list[dict[str, Any]] | None:
        """A re-dispatch: say what happens to the step left open, and settle a side-effecting tool.

        Returns the steps it read when it wrote none (the first `_plan` goes on from them)."""
        steps = self.store.steps(t.turn_id)
        last = steps[-1] if steps else None
        if last is None or last["status"] != "running":
            return steps  # nothing open ("waiting": the gate resumes its approval)
        if last["kind"] == "model":  # (a step begun by this very attempt comes as `t.begun`: never here)
            t.recovered(last["step"], "model", "repeated",
                        reason="the runner stopped during the model call; it is asked again")
            return steps
        tool = last["tool"] or ""
        if tool not in SIDE_EFFECTING:
            t.recovered(last["step"], "tool", "rerun", tool=tool,
                        reason=f"the runner stopped while {tool} ran; it is read-only, so it runs again")
            return steps
        self._interrupt_tool(t, last)
        return None

    def _interrupt_tool(self, t: LoopTurn, row: dict[str, Any]) -> None:
        """A side-effecting tool whose runner stopped mid-run: never run again (see the docstring)."""
        _, _, call, later = self._next(t)
        captured = self._captured_output(t, row["call_id"])
        self._store_tool(t, row["step"], call or {"call_id": row["call_id"], "name": row["tool"]},
                         INTERRUPTED.format(captured=captured), "interrupted")
        self._not_run(t, row["step"] + 1, later, NOT_RUN_INTERRUPTED)
        t.recovered(row["step"], "tool", "interrupted", tool=row["tool"],
                    reason=f"the runner stopped while {row['tool']} ran; it is not run again "
                           "(it may or may not have taken effect)")

    # --- model steps -----------------------------------------------------------------

    async def _model_step(self, t: LoopTurn, n: int, plan: _Plan) -> str | None:
        if plan.open is None or plan.open["attempt"] != t.attempt:  # else begun for this attempt already
            self.store.begin_step(t.session_id, t.turn_id, n, "model", attempt=t.attempt)
        # (the turn's items as `plan` read them: beginning a step stores none)
        built = self.histories.build(self.store, t.session_id, t.input_item_id, t.turn_id, turn_items=plan.items)
        if not await self._send_turn_start(t, n, built, incremental=True):
            return "lost"
        return await self._model_answer(t, n, built)

    async def _send_turn_start(self, t: LoopTurn, n: int, built: Built, *, incremental: bool) -> bool:
        """One model step's TurnStart: only what is new to a runner that holds the rest (False: it is gone).

        A runner whose hello announced `history_cache` keeps each session's
        last history (runner/history_cache.py); what this connection was sent
        is `conn.histories` (under the session's generation, so a rebinding
        sends in full). The model gets the same full history either way: the
        runner rebuilds it, and answers `HistoryMiss` when its copy is not the
        one named (then `_model_answer` sends the step again in full)."""
        conn = t.conn
        cached = HISTORY_CACHE in conn.features
        base = sent_base(built, conn.histories.get(t.session_id), t.generation) if cached and incremental else 0
        model = t.conv.get("model_override") or t.spec.get("model") or ""
        frame = p.TurnStart(
            turn_id=t.turn_id, session_id=t.session_id, attempt=t.attempt, agent=t.spec,
            input=built.items[base:], model=model,
            reasoning_effort=t.conv.get("reasoning_effort") or t.spec.get("reasoning_effort"),
            generation=t.generation, step=n, workspace=t.conv.get("workspace"),
            history_from=base, history_hash=built.links[base - 1].hex() if base else "",
        )
        if cached:
            conn.histories[t.session_id] = SentHistory(t.generation, len(built.items),
                                                       built.links[-1] if built.links else ZERO,
                                                       built.settled, built.epoch)
        mark(f"turn.dispatched:{t.turn_id}")
        try:
            await conn.send(frame)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return False
        return True

    async def _model_answer(self, t: LoopTurn, n: int, built: Built | None = None) -> str | None:
        while True:
            frame = await self._follow(t, (p.TurnCompleted, p.TurnFailed, p.HistoryMiss))
            if isinstance(frame, str):
                return frame
            if not isinstance(frame, p.HistoryMiss):
                break
            if frame.attempt != t.attempt or frame.step != n:
                continue  # about a TurnStart of before: that one is long answered
            # the runner's copy is not the one named, and it called no model: the same step in full
            log.info("turn %s step %d: runner %s does not hold the history named; sent in full",
                     t.turn_id, n, t.runner_id)
            t.conn.histories.pop(t.session_id, None)
            if built is None:
                built = self.histories.build(self.store, t.session_id, t.input_item_id, t.turn_id)
            if not await self._send_turn_start(t, n, built, incremental=False):
                return "lost"
        if isinstance(frame, p.TurnFailed):
            if frame.code == "cancelled":
                self.store.end_step(t.turn_id, n, "cancelled", error="cancelled")
                self.outcomes.cancelled(t.session_id, t.turn_id)
                return "cancelled"
            if frame.output:  # a partial answer (stream dropped): kept, marked incomplete
                self.store.append_turn_output(t.session_id, t.turn_id, frame.output, None)
            self.store.end_step(t.turn_id, n, "failed", error=frame.message)
            self.outcomes.fail(t.session_id, t.turn_id, frame.code, frame.message)
            return "failed"
        calls = [item for item in frame.output if item.get("type") == "function_call"]
        if not calls:
            mark(f"turn.answered:{t.turn_id}")
            self._complete(t, frame, n)
            mark(f"turn.ended:{t.turn_id}")
            return "completed"
        with self.hub.transaction(t.session_id) as tx:  # the step's output before any of its tools runs
            if self.store.finish_model_step(t.session_id, t.turn_id, n, frame.output, frame.response_id,
                                            frame.usage):
                self._publish_unannounced(tx, t, frame)
                self._publish_usage(tx, t, n, frame.usage)
        done = sum(s["kind"] == "model" and s["status"] == "completed" for s in self.store.steps(t.turn_id))
        limit = int(t.spec.get("max_steps") or DEFAULT_MAX_STEPS)
        if done >= limit:
            self._not_run(t, n + 1, calls, NOT_RUN_LIMIT)
            self.outcomes.fail(t.session_id, t.turn_id, "max_steps", f"stopped after {done} model steps (max_steps)")
            return "failed"
        return None

    def _complete(self, t: LoopTurn, frame: p.TurnCompleted | None, n: int | None = None) -> None:
        """The model answered without tool calls: its step, the turn's end and their events at once."""
        with self.hub.transaction(t.session_id) as tx:
            done = None
            if frame is not None and n is not None:
                done = self.store.complete_model_step(t.session_id, t.turn_id, n, frame.output,
                                                      frame.response_id, frame.usage)
                if done is None:
                    return  # a duplicate answer: the step (and the turn) ended already
                self._publish_unannounced(tx, t, frame)
            # the turn's usage as it ends (ending it changes none): the sum over its steps
            ended = self.store.end_turn(t.turn_id, "completed")
            if done is not None:
                summed = done.turn_usage  # summed by the step's own write
            else:
                summed = self.store.turn_usage(t.turn_id) if ended else None
            if frame is not None and n is not None:  # events go out in the order published: usage first
                self._publish_usage(tx, t, n, frame.usage, summed=summed)
            if not ended:
                return
            if self._release_claim is not None:  # nothing of the turn is left to write
                self._release_claim(t.session_id)
            # a turn whose output this step alone stored (most: one model step) need not read it back
            if done is not None and done.first_index == 0:
                output = done.items
            else:
                output = self.turn_items(t.session_id, t.turn_id)
            response = {"id": frame.response_id if frame else None, "object": "response", "status": "completed",
                        "output": output, "usage": summed or (frame.usage if frame else None)}
            tx.publish(ev.COMPLETED, turn_id=t.turn_id, response=response)
            tx.publish(ev.SESSION_STATUS, status="idle")

    def _publish_unannounced(self, tx: Any, t: LoopTurn, frame: p.TurnCompleted) -> None:
        """The `output_item.done` events of the step's last items, which the runner left to its
        `TurnCompleted` (`ITEMS_IN_COMPLETED`): published where the runner's would have come,
        after its deltas and before the step's usage."""
        for item in frame.unannounced_items():
            tx.publish(ev.ITEM_DONE, turn_id=t.turn_id, item=item)

    def _publish_usage(self, tx: Any, t: LoopTurn, n: int, usage: dict[str, Any] | None,
                       summed: dict[str, Any] | None = None) -> None:
        """`session.usage` of step `n`; `summed`: the turn's usage after it, when the caller has it."""
        if usage:
            summed = summed or self.store.turn_usage(t.turn_id) or usage
            tx.publish(ev.USAGE, turn_id=t.turn_id, step=n, usage=usage, turn=summed)

    # --- following what the runner sends -------------------------------------------------

    async def _follow_open_step(self, t: LoopTurn) -> str | None:
        """An adopted attempt: the runner still runs the open step; take its end as if dispatched here."""
        kind, n, call, later = self._next(t)
        if kind == "model":
            return await self._model_answer(t, n)
        if kind == "tool" and call is not None:
            return await self._tool_answer(t, n, call, later)
        return None

    async def _follow(self, t: LoopTurn, ends: tuple[type, ...], *, call_id: str | None = None,
                      preview: bool = False) -> Any:
        """Relay the runner's events until one of `ends` for this step; "lost" or "moved" otherwise."""
        async for frame in t.frames:
            if frame is MOVED:
                return self._moved_out(t, running=True)
            if isinstance(frame, p.TurnEvent):
                event = frame.event
                if event.get("type") == ev.TOOL_OUTPUT and isinstance(event.get("delta"), str):
                    self._captured.setdefault((t.turn_id, event.get("call_id") or ""), []).append(event["delta"])
                # an item is done just before its step ends, or a frame waits behind it already:
                # stored with what follows (within the hub's batch interval), not on its own
                soon = event.get("type") == ev.ITEM_DONE or t.frames.statistics().current_buffer_used > 0
                self.outcomes.relay(t.session_id, t.turn_id, event, soon=soon)
                continue
            if not isinstance(frame, ends):
                continue  # a late frame of an earlier step of this turn
            if isinstance(frame, p.ToolResult) and (frame.call_id != call_id or (frame.status == "preview") != preview):
                continue
            if self._has_moved(t.session_id, t.turn_id, t.generation):
                return self._moved_out(t, running=False)
            return frame
        return "lost"

    def _moved_out(self, t: LoopTurn, *, running: bool) -> str:
        log.warning("turn %s: the session moved on; what runner %s sends for it is refused",
                    t.turn_id, t.runner_id)
        self._moved_done(t.session_id)
        if running:  # still running there: stop it, and drop what it sends up to its end
            t.conn.draining.add(t.turn_id)
            try:
                t.conn.outbox.send_nowait(p.Cancel(turn_id=t.turn_id))
            except (trio.WouldBlock, trio.ClosedResourceError):
                pass  # gone or stuck: the ping verdict ends it
        return "moved"

    # --- what the store holds ------------------------------------------------------------

    def turn_items(self, session_id: str, turn_id: str) -> list[dict[str, Any]]:
        """The turn's own items (what its steps stored), in order."""
        return self.store.list_turn_items(session_id, turn_id)

    def history(self, t: LoopTurn) -> list[dict[str, Any]]:
        """The model's input for the next step: the conversation up to the turn's message, then its steps."""
        return self.histories.build(self.store, t.session_id, t.input_item_id, t.turn_id).items
