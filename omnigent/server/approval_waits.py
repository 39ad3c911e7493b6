"""Who decides whether a tool call may run, and the wait for a person's answer.

The loop (`agent_loop.py`, its tool steps in `loop_tools.py`) asks `ToolGate.decide` before every tool step.
The answer depends on the call and on the session's *effective mode*, the
strictest of the session's own (`conversations.permission_mode`, else the
spec's `permissions`) and its runner's host policy (`HostHello.permissions`,
or for the in-process host `RunnerRegistry.local_permissions`):

- a read-only tool runs ("read_only");
- a side-effecting one under `deny` does not ("not approved: the permission mode is deny");
- under `auto` it runs ("auto");
- under `ask` it runs if an "always" rule of the session covers (tool, target)
  ("user"), else a person is asked: for write/edit a preview diff first (a
  `preview` ToolStart, bounded), then an `approvals` row, the
  `session.approval.requested` event and session.status "waiting", then a wait
  for `approval_answered` (any client, through the API) or the turn's
  `approval_timeout` (0: refuse at once; None: wait until answered).

What it guarantees: one approval row per asking; every asking ends resolved
(allowed, denied, timeout, cancelled, expired) with one
`session.approval.resolved`; the wait runs on trio's clock; an approval
created by this process is waited for again after a runner loss (the same
id), while one of a dead predecessor is expired and asked again.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from protocol import events as ev

from ..tools.policy import SIDE_EFFECTING, allowed, approval_target, strictest
from .hub import EventHub

if TYPE_CHECKING:
    from ..store import Store

log = logging.getLogger("omnigent.server.approvals")

PREVIEW_WAIT = 5.0  # seconds a write/edit preview may take before the question goes without a diff
PREVIEWED = frozenset({"write_file", "edit_file"})


def effective_mode(session_mode: str | None, spec_mode: str | None, host_policy: str | None) -> str:
    """The strictest of the session's mode (its own, else its spec's) and its host's policy."""
    return strictest(session_mode or spec_mode, host_policy)


@dataclass(frozen=True)
class Decision:
    """What the gate decided for one call: run it (with `approval`), or store `message` instead.

    `outcome`: "run" | "refused" | "cancelled" | "lost" (the runner was gone when it was time to run).
    """

    outcome: str
    approval: str = ""
    message: str = ""


class ApprovalWaits:
    """The approvals this process waits on, and the event that wakes each wait."""

    def __init__(self) -> None:
        self._events: dict[str, trio.Event] = {}
        # created in this server's life (waited for again after a runner loss): its deadline on
        # trio's clock (inf: none)
        self._deadlines: dict[str, float] = {}

    def created(self, approval_id: str, timeout: float | None) -> None:
        self._deadlines[approval_id] = math.inf if timeout is None else trio.current_time() + max(0.0, timeout)
        self._events.setdefault(approval_id, trio.Event())

    def is_mine(self, approval_id: str) -> bool:
        return approval_id in self._deadlines

    def answered(self, approval_id: str) -> None:
        event = self._events.get(approval_id)
        if event is not None:
            event.set()

    async def wait(self, approval_id: str) -> bool:
        """Until answered (True) or its deadline passed (False)."""
        event = self._events.setdefault(approval_id, trio.Event())
        deadline = self._deadlines.get(approval_id, math.inf)
        if deadline <= trio.current_time():
            return event.is_set()
        with trio.move_on_at(deadline):
            await event.wait()
            return True
        return False

    def forget(self, approval_id: str) -> None:
        self._events.pop(approval_id, None)
        self._deadlines.pop(approval_id, None)


class ToolGate:
    """Decides each tool call of the loop (see the module docstring)."""

    def __init__(self, store: Store, hub: EventHub, waits: ApprovalWaits) -> None:
        self.store = store
        self.hub = hub
        self.waits = waits

    async def decide(self, t: Any, step: int, call: dict[str, Any],
                     preview: Callable[[], Awaitable[str]]) -> Decision:
        """Whether tool step `step` (the model's `call`) of loop turn `t` may run.

        `preview()` asks the runner for the diff of a write/edit (raises on a lost runner).
        Resumes a stored approval of this step if there is one.
        """
        name, arguments = call.get("name") or "", call.get("arguments") or ""
        if name not in SIDE_EFFECTING:
            return Decision("run", "read_only")
        mode = t.mode
        if not allowed(name, mode):
            return Decision("refused", message="not approved: the permission mode is deny")
        if mode == "auto":
            return Decision("run", "auto")
        target = approval_target(name, arguments)
        if self.store.rule_matches(t.session_id, name, target):
            return Decision("run", "user")
        approval = self._stored(t.turn_id, step)
        if approval is not None and approval["status"] != "pending":
            return self._decided(approval)
        if approval is not None and not self.waits.is_mine(approval["id"]):
            # asked by a process that is gone (the tree or server died): that question is void
            if self.store.resolve_approval(approval["id"], "expired", "server") is not None:
                self._publish_resolved(t, approval, "expired", "server")
            t.recovered(step, "approval", "asked_again", tool=name,
                        reason="the approval was pending when the server stopped; asked again")
            approval = None
        if approval is None:
            approval = await self._ask(t, step, call, name, arguments, target, preview)
        return await self._await_answer(t, approval)

    def _stored(self, turn_id: str, step: int) -> dict[str, Any] | None:
        """The newest approval of this turn's step, if it was asked before."""
        rows = [a for a in self.store.list_approvals(self._conv_of(turn_id))
                if a["turn_id"] == turn_id and a["step"] == step]
        return rows[-1] if rows else None

    def _conv_of(self, turn_id: str) -> str:
        turn = self.store.get_turn(turn_id) or {}
        return turn.get("conversation_id") or ""

    async def _ask(self, t: Any, step: int, call: dict[str, Any], name: str, arguments: str, target: str,
                   preview: Callable[[], Awaitable[str]]) -> dict[str, Any]:
        diff = ""
        if name in PREVIEWED:
            with trio.move_on_after(PREVIEW_WAIT):
                diff = await preview()
        timeout = t.approval_timeout
        expires_at = None if timeout is None else self.store._clock() + max(0.0, timeout)
        with self.hub.transaction(t.session_id) as tx:  # the question and its events at once
            approval = self.store.create_approval(t.session_id, t.turn_id, step, call.get("call_id") or "",
                                                  name, arguments, target, diff or None, expires_at)
            fields: dict[str, Any] = {"approval_id": approval["id"], "call_id": call.get("call_id") or "",
                                      "tool": name, "arguments": arguments, "step": step, "target": target}
            if diff:
                fields["diff"] = diff
            if expires_at is not None:
                fields["expires_at"] = expires_at
            tx.publish(ev.APPROVAL_REQUESTED, turn_id=t.turn_id, **fields)
            tx.publish(ev.SESSION_STATUS, status="waiting", turn_id=t.turn_id)
        self.waits.created(approval["id"], timeout)
        return approval

    async def _await_answer(self, t: Any, approval: dict[str, Any]) -> Decision:
        approval_id = approval["id"]
        t.waiting_for = approval_id
        try:
            with trio.CancelScope() as scope:
                t.approval_scope = scope
                if t.cancel_requested:
                    scope.cancel()
                answered = await self.waits.wait(approval_id)
        finally:
            t.approval_scope = None
            t.waiting_for = None
        if scope.cancelled_caught:
            row = self.store.resolve_approval(approval_id, "cancelled", "user")
            if row is not None:
                self._publish_resolved(t, approval, "cancelled", "user")
                self.waits.forget(approval_id)
                return Decision("cancelled", message="cancelled by the user before it was approved")
        elif not answered:
            row = self.store.resolve_approval(approval_id, "timeout", "server")
            if row is not None:
                self._publish_resolved(t, approval, "timeout", "server")
        self.waits.forget(approval_id)
        current = self.store.get_approval(approval_id) or approval
        self.hub.publish(t.session_id, ev.SESSION_STATUS, status="running", turn_id=t.turn_id)
        return self._decided(current)

    def _decided(self, approval: dict[str, Any]) -> Decision:
        status, decision = approval["status"], approval.get("decision")
        if status == "allowed" or decision in ("allow", "always"):
            return Decision("run", "user")
        if status == "cancelled":
            return Decision("cancelled", message="cancelled by the user before it was approved")
        if decision == "timeout" or status == "expired":
            return Decision("refused", message=_NOT_APPROVED_TIMEOUT)
        return Decision("refused", message="not approved: the user denied this call")

    def answered(self, session_id: str, approval_id: str) -> None:
        """An answer was stored (the API route): tell watchers, wake the wait."""
        approval = self.store.get_approval(approval_id)
        if approval is None or approval["status"] == "pending":
            return
        self._publish_resolved(_Who(session_id, approval["turn_id"]), approval,
                               approval.get("decision") or approval["status"], approval.get("decided_by") or "user")
        self.waits.answered(approval_id)

    def _publish_resolved(self, t: Any, approval: dict[str, Any], decision: str, by: str) -> None:
        self.hub.publish(t.session_id, ev.APPROVAL_RESOLVED, turn_id=t.turn_id, approval_id=approval["id"],
                         call_id=approval.get("call_id") or "", decision=decision, by=by)


@dataclass
class _Who:
    session_id: str
    turn_id: str


_NOT_APPROVED_TIMEOUT = ("not approved: nobody answered the approval in time (no terminal to ask?); "
                         "the user can allow it with --permission-mode auto")

