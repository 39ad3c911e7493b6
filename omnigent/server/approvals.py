"""A session's approvals and "always" rules: answering, listing, revoking.

- `POST /v1/sessions/{id}/events {"type": "approval", "data": {approval_id, decision}}`
  (routed here by conversation.py): the first answer wins; a later one is 409
  `already_resolved`, an unknown id 404, a decision other than allow, deny or
  always 400. Once the answer is stored the turn's loop is woken
  (`TurnService.approval_answered`, which publishes `session.approval.resolved`);
  a server without that hook publishes the event with the answer itself.
- `GET /v1/sessions/{id}/approvals?status=pending`: the session's approvals.
- `GET /v1/sessions/{id}/permissions`: its "always" rules;
  `DELETE /v1/sessions/{id}/permissions/{rule_id}` revokes one.

An approval belongs to the session, not to a terminal: any client with the
token may answer it (the REPL, `omnigent attach`, the SDK).
"""

from __future__ import annotations

import inspect
from typing import Any

from quart import request

from protocol import events as ev

from ..store.approvals import APPROVAL_STATUSES
from ._routes import conversation
from .errors import ApiError, invalid, not_found
from .state import ServerState

USER_DECISIONS = ("allow", "deny", "always")


async def answer(state: ServerState, session_id: str, data: Any) -> tuple[dict[str, Any], int]:
    """Store a user's answer to a pending approval (the `approval` event of POST .../events)."""
    if not isinstance(data, dict):
        raise invalid("'data' must be an object {approval_id, decision}")
    approval_id, decision, by = data.get("approval_id"), data.get("decision"), data.get("by", "client")
    if not isinstance(approval_id, str) or not approval_id:
        raise invalid("'approval_id' must be a non-empty string")
    if decision not in USER_DECISIONS:
        raise invalid(f"'decision' must be one of {', '.join(USER_DECISIONS)}")
    if not isinstance(by, str) or not 0 < len(by) <= 100:
        raise invalid("'by' must be a string of 1 to 100 characters")
    approval = state.store.get_approval(approval_id)
    if approval is None or approval["conversation_id"] != session_id:
        raise not_found("Approval")
    # the loop's wake-up (TurnService.approval_answered), which also publishes the resolution;
    # without one (no agent loop in this server) the answer and its event commit together here
    answered = getattr(state.turns, "approval_answered", None)
    with state.hub.transaction(session_id) as tx:
        resolved = state.store.resolve_approval(approval_id, decision, by)
        if resolved is not None and answered is None:
            tx.publish(ev.APPROVAL_RESOLVED, turn_id=resolved["turn_id"], approval_id=approval_id,
                       call_id=resolved["call_id"] or "", decision=decision, by=by)
    if resolved is None:
        current = state.store.get_approval(approval_id) or approval
        raise ApiError("already_resolved", f"approval {approval_id} is already {current['status']}"
                                           + (f" ({current['decision']})" if current.get("decision") else ""))
    if answered is not None and inspect.isawaitable(woken := answered(session_id, approval_id)):
        await woken
    return {"approval_id": approval_id, "decision": decision, "status": resolved["status"]}, 200


def register(app: Any, state: ServerState) -> None:
    store = state.store

    @app.get("/v1/sessions/<session_id>/approvals")
    async def list_approvals(session_id: str):
        conversation(state, session_id)
        status = request.args.get("status")
        if status is not None and status not in APPROVAL_STATUSES:
            raise invalid(f"status must be one of {', '.join(APPROVAL_STATUSES)}")
        return {"object": "list", "data": store.list_approvals(session_id, status)}

    @app.get("/v1/sessions/<session_id>/permissions")
    async def list_permissions(session_id: str):
        conversation(state, session_id)
        return {"object": "list", "data": store.list_rules(session_id)}

    @app.delete("/v1/sessions/<session_id>/permissions/<rule_id>")
    async def revoke_permission(session_id: str, rule_id: str):
        conversation(state, session_id)
        if not store.remove_rule(session_id, rule_id):
            raise not_found("Permission rule")
        return {"id": rule_id, "object": "permission", "deleted": True}
