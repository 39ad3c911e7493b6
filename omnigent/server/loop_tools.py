"""The tool steps of the agent loop, and the closing of a turn's open steps.

`AgentLoop` (`agent_loop.py`) is built from this mixin and its own model
steps and following; callers only ever see `close_open_steps`. A tool step
is one `ToolStart(step=n)` for one `function_call`, answered by one
`ToolResult`.

What it guarantees:
- Every `function_call` gets exactly one `function_call_output`, stored with
  its step row and `session.tool.completed` in one transaction
  (`_store_tool`), before the next model call; a second result for the same
  step stores nothing and publishes nothing.
- A tool step is begun "waiting" and only marked running, with
  `session.tool.started`, once the gate has decided and the session is still
  this attempt's: a crash before that never reads as a side-effecting tool
  that may have run. A runner lost before its `ToolStart` went out leaves
  the step waiting, so the next runner runs it as decided.
- Calls that will never run (cancelled, failed, the step limit, an earlier
  call interrupted) get their `not run: ...` output at once (`_not_run`);
  a turn ended early keeps no step open (`close_open_steps`).
- What a tool streamed is kept in memory for its output if it is cut short,
  and read back from the event log after a restart (`_captured_output`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

import protocol as p
from protocol import events as ev

from .loop_turn import OPEN

if TYPE_CHECKING:
    from ..store import Store
    from .approval_waits import ToolGate
    from .hub import EventHub
    from .loop_turn import LoopTurn
    from .outcomes import Outcomes

DEFAULT_TOOL_TIMEOUT = 120.0
INTERRUPTED = ("interrupted: the runner stopped while this ran; the command may or may not have taken "
               "effect. Output captured before that:\n{captured}")
NOT_RUN_INTERRUPTED = "not run: an earlier call of this step was interrupted"
NOT_RUN_LIMIT = "not run: the step limit was reached"
NOT_RUN_CANCELLED = "not run: the turn was cancelled"
NOT_RUN_FAILED = "not run: the turn failed"
_CAPTURE_SCAN = 5000  # events read back for a tool's output after a restart


class ToolStepsMixin:
    """The tool steps of `AgentLoop` and `close_open_steps`, over its store, hub, gate and outcomes."""

    store: Store
    hub: EventHub
    outcomes: Outcomes
    gate: ToolGate
    _has_moved: Callable[[str, str, int], bool]
    _captured: dict[tuple[str, str], list[str]]  # (turn, call) -> output, this server's life

    if TYPE_CHECKING:  # AgentLoop's own
        def _next(self, t: LoopTurn) -> tuple[str, int, dict[str, Any] | None, list[dict[str, Any]]]: ...
        async def _follow(self, t: LoopTurn, ends: tuple[type, ...], *, call_id: str | None = None,
                          preview: bool = False) -> Any: ...
        def _moved_out(self, t: LoopTurn, *, running: bool) -> str: ...

    # --- tool steps --------------------------------------------------------------------

    async def _tool_step(self, t: LoopTurn, n: int, call: dict[str, Any], later: list[dict[str, Any]]) -> str | None:
        call_id, name, arguments = call.get("call_id") or "", call.get("name") or "", call.get("arguments") or ""
        # "waiting" until it is dispatched: a crash before that (asking its approval, say) never
        # reads as a side-effecting tool that may have run, so the restart asks again (one
        # transaction: begun and waiting)
        self.store.begin_step(t.session_id, t.turn_id, n, "tool", call_id=call_id, tool=name,
                              arguments=arguments, attempt=t.attempt, waiting=True)
        decision = await self.gate.decide(t, n, call, lambda: self._preview(t, n, call))
        if decision.outcome == "refused":
            self._store_tool(t, n, call, decision.message, "completed", shown="not_approved")
            return None
        if decision.outcome == "cancelled":
            self._store_tool(t, n, call, decision.message, "cancelled")
            self._not_run(t, n + 1, later, NOT_RUN_CANCELLED)
            self.outcomes.cancelled(t.session_id, t.turn_id)
            return "cancelled"
        if t.conn.gone:  # lost while it waited for an answer: the next runner runs it, as decided
            self.store.set_step_waiting(t.turn_id, n, True)
            return "lost"
        if self._has_moved(t.session_id, t.turn_id, t.generation):
            self.store.set_step_waiting(t.turn_id, n, True)
            return self._moved_out(t, running=False)
        with self.hub.transaction(t.session_id) as tx:
            self.store.set_step_waiting(t.turn_id, n, False)
            tx.publish(ev.TOOL_STARTED, turn_id=t.turn_id, step=n, call_id=call_id, tool=name, arguments=arguments)
        try:
            await t.conn.send(self._tool_start(t, n, call, decision.approval))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self.store.set_step_waiting(t.turn_id, n, True)  # it never left: run it on the next runner
            return "lost"
        return await self._tool_answer(t, n, call, later)

    async def _tool_answer(self, t: LoopTurn, n: int, call: dict[str, Any], later: list[dict[str, Any]]) -> str | None:
        result = await self._follow(t, (p.ToolResult, p.TurnFailed), call_id=call.get("call_id") or "")
        if isinstance(result, str):
            return result
        if isinstance(result, p.TurnFailed):  # the runner could not run it at all
            status = "cancelled" if result.code == "cancelled" else "error"
            output = self._captured_output(t, call.get("call_id") or "")
            text = (f"cancelled by the user. Output so far:\n{output}" if status == "cancelled"
                    else f"error: the runner could not run this tool: {result.message}")
            result = p.ToolResult(t.turn_id, call.get("call_id") or "", status, text)
        self._store_tool(t, n, call, result.output, result.status)
        self._captured.pop((t.turn_id, call.get("call_id") or ""), None)
        if result.status == "cancelled" or t.cancel_requested:
            self._not_run(t, n + 1, later, NOT_RUN_CANCELLED)
            self.outcomes.cancelled(t.session_id, t.turn_id)
            return "cancelled"
        return None

    def _tool_start(self, t: LoopTurn, n: int, call: dict[str, Any], approval: str) -> p.ToolStart:
        name = call.get("name") or ""
        timeouts = t.spec.get("tool_timeouts") or {}
        timeout = timeouts.get(name) or timeouts.get("default") or DEFAULT_TOOL_TIMEOUT
        return p.ToolStart(turn_id=t.turn_id, session_id=t.session_id, attempt=t.attempt, step=n,
                           call_id=call.get("call_id") or "", name=name, arguments=call.get("arguments") or "",
                           approval=approval, timeout_s=float(timeout), workspace=t.conv.get("workspace"),
                           generation=t.generation)

    async def _preview(self, t: LoopTurn, n: int, call: dict[str, Any]) -> str:
        """The diff a write/edit would make, from the runner ("" when it cannot say)."""
        try:
            await t.conn.send(self._tool_start(t, n, call, "preview"))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return ""
        result = await self._follow(t, (p.ToolResult,), call_id=call.get("call_id") or "", preview=True)
        return result.output if isinstance(result, p.ToolResult) and result.status == "preview" else ""

    def _store_tool(self, t: LoopTurn, n: int, call: dict[str, Any], output: str, status: str,
                    shown: str | None = None) -> None:
        call_id = call.get("call_id") or ""
        with self.hub.transaction(t.session_id) as tx:  # the result and its event at once
            if self.store.finish_tool_step(t.session_id, t.turn_id, n, call_id, output, status):
                latest = self.store.list_items(t.session_id, order="desc", limit=1)
                item = latest[0] if latest else {"type": "function_call_output", "call_id": call_id, "output": output}
                tx.publish(ev.TOOL_DONE, turn_id=t.turn_id, step=n, call_id=call_id, tool=call.get("name") or "",
                           status=shown or status, item=item)

    def _not_run(self, t: LoopTurn, first: int, calls: list[dict[str, Any]], why: str) -> None:
        """Calls that will never run get their output now (steps `first`, `first + 1`, ...)."""
        for offset, call in enumerate(calls):
            n = first + offset
            self.store.begin_step(t.session_id, t.turn_id, n, "tool", call_id=call.get("call_id"),
                                  tool=call.get("name"), arguments=call.get("arguments"), attempt=t.attempt)
            self._store_tool(t, n, call, why, "not_run")

    def close_open_steps(self, session_id: str, turn_id: str, status: str) -> None:
        """A turn ended early (failed, cancelled): no step stays open, no call without an output."""
        steps = self.store.steps(turn_id)
        last = steps[-1] if steps else None
        t = _Closing(session_id, turn_id, self.hub)
        if last is not None and last["status"] in OPEN:
            if last["kind"] == "model":
                self.store.end_step(turn_id, last["step"], "cancelled" if status == "cancelled" else "failed",
                                    error=f"the turn was {status}")
            elif last["status"] == "running":
                self._store_tool(t, last["step"], {"call_id": last["call_id"], "name": last["tool"]},  # type: ignore[arg-type]
                                 INTERRUPTED.format(captured=self._captured_output(t, last["call_id"])),
                                 "interrupted")
        _, n, call, later = self._next(t)  # type: ignore[arg-type]
        why = NOT_RUN_CANCELLED if status == "cancelled" else NOT_RUN_FAILED
        self._not_run(t, n, ([call] if call else []) + later, why)  # type: ignore[arg-type]
    def _captured_output(self, t: Any, call_id: str) -> str:
        """What the tool streamed before its runner stopped: kept in memory, else read back from the log."""
        chunks = self._captured.pop((t.turn_id, call_id), None)
        if chunks is None:
            after = max(0, self.store.last_event_seq(t.session_id) - _CAPTURE_SCAN)
            chunks = []
            while True:
                events = self.store.read_events(t.session_id, after, limit=500)
                if not events:
                    break
                after = events[-1]["sequence_number"]
                chunks += [e["delta"] for e in events if e.get("type") == ev.TOOL_OUTPUT
                           and e.get("turn_id") == t.turn_id and e.get("call_id") == call_id]
        return "".join(chunks)



@dataclass
class _Closing:
    """What `close_open_steps` needs of a loop turn when no attempt is running."""

    session_id: str
    turn_id: str
    hub: EventHub
    attempt: int = 0
