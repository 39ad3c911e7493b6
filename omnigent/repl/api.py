"""The session calls of the agent loop that the front end makes: messages, approvals, rules, usage.

Each goes through the SDK method when this client has it (`client.sessions.approve`,
`approvals`, `permissions`, `revoke`) and otherwise through the same HTTP route
by the client's generic calls, so the REPL does not depend on which SDK
version it is paired with. All return plain dicts.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ..client import OmnigentClient

DECISIONS = ("allow", "deny", "always")


def _path(session_id: str, tail: str = "") -> str:
    return f"/v1/sessions/{quote(session_id, safe='')}{tail}"


def _raw(value: Any) -> Any:
    return getattr(value, "raw", value)


async def post_message(client: OmnigentClient, session_id: str, text: str, *,
                       approval_timeout: float | None) -> dict[str, Any]:
    """Queue a user message whose approvals wait `approval_timeout` s (None: until answered; 0: refuse)."""
    data = {"role": "user", "content": [{"type": "input_text", "text": text}],
            "approval_timeout": approval_timeout}
    return await client.sessions.post_event(session_id, {"type": "message", "data": data})


async def retry(client: OmnigentClient, session_id: str, *, approval_timeout: float | None) -> dict[str, Any]:
    """Run the last interrupted turn again. The approval timeout goes along for a server that
    takes it (a turn first posted at a terminal, retried from a pipe, must not wait for an answer)."""
    return await client.sessions.post_event(session_id, {"type": "retry",
                                                         "data": {"approval_timeout": approval_timeout}})


async def approve(client: OmnigentClient, session_id: str, approval_id: str, decision: str) -> dict[str, Any]:
    """Answer an approval; `ConflictError` (409) when it was answered first elsewhere."""
    if decision not in DECISIONS:
        raise ValueError(f"decision must be one of {DECISIONS}")
    method = getattr(client.sessions, "approve", None)
    if method is not None:
        return _raw(await method(session_id, approval_id, decision))
    return await client.sessions.post_event(
        session_id, {"type": "approval", "data": {"approval_id": approval_id, "decision": decision}})


async def _get(client: OmnigentClient, path: str, **params: Any) -> Any:
    return await client._t.request("GET", path, params={k: v for k, v in params.items() if v is not None})


def _rows(body: Any) -> list[dict[str, Any]]:
    if isinstance(body, dict):
        body = body.get("data", [])
    return [_raw(row) for row in body or ()]


async def pending_approvals(client: OmnigentClient, session_id: str) -> list[dict[str, Any]]:
    method = getattr(client.sessions, "approvals", None)
    if method is not None:
        return _rows(await method(session_id, status="pending"))
    return _rows(await _get(client, _path(session_id, "/approvals"), status="pending"))


async def rules(client: OmnigentClient, session_id: str) -> list[dict[str, Any]]:
    """The session's "always" rules, oldest first."""
    method = getattr(client.sessions, "permissions", None)
    if method is not None:
        return _rows(await method(session_id))
    return _rows(await _get(client, _path(session_id, "/permissions")))


async def revoke(client: OmnigentClient, session_id: str, rule_id: str) -> None:
    method = getattr(client.sessions, "revoke", None)
    if method is not None:
        await method(session_id, rule_id)
        return
    await client._t.send("DELETE", _path(session_id, f"/permissions/{quote(str(rule_id), safe='')}"))
