"""`client.sessions`: create, read, change and follow sessions.

Each method is one API call (two for `create`, which returns the full
snapshot), returning typed resources; `stream` returns a `SessionStream`.
"""

from __future__ import annotations

import builtins
import json
from typing import Any
from urllib.parse import quote

from ._events import message_text
from ._http import Transport
from ._stream import SessionStream
from ._types import Session, SessionListItem


class _NotGiven:
    """The default of `approval_timeout=`: not sent, so the server's default applies (None is a value)."""

    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN: Any = _NotGiven()


def _path(session_id: str, tail: str = "") -> str:
    return f"/v1/sessions/{quote(session_id, safe='')}{tail}"


def user_message(content: str | builtins.list[dict[str, Any]], *,
                 approval_timeout: float | None = NOT_GIVEN) -> dict[str, Any]:
    """The `message` event for a user turn; a string becomes one `input_text` part.

    `approval_timeout`: how long an approval of this turn waits for an answer
    (seconds; 0 refuses at once; None waits until answered); not given, the
    server's default (`OMNIGENT_APPROVAL_TIMEOUT`, 10 min).
    """
    if isinstance(content, str):
        content = [{"type": "input_text", "text": content}]
    data: dict[str, Any] = {"role": "user", "content": content}
    if approval_timeout is not NOT_GIVEN:
        data["approval_timeout"] = approval_timeout
    return {"type": "message", "data": data}


class SessionsNamespace:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    async def create(self, bundle: bytes, *, filename: str = "agent.tar.gz", title: str | None = None,
                     labels: dict[str, str] | None = None, reasoning_effort: str | None = None,
                     workspace: str | None = None, permission_mode: str | None = None) -> Session:
        """Upload an agent bundle (a gzip tarball, see `omnigent.cli._bundle`) and start a session on it.

        `permission_mode` (ask | auto | deny) can only make the session stricter
        than the host that runs its tools allows.
        """
        meta = {k: v for k, v in {"title": title, "labels": labels, "reasoning_effort": reasoning_effort,
                                  "workspace": workspace, "permission_mode": permission_mode}.items()
                if v is not None}
        created = await self.create_raw(bundle, filename=filename, **meta)
        return await self.get(created["session_id"])

    async def create_raw(self, bundle: bytes, *, filename: str = "agent.tar.gz", **metadata: Any) -> dict[str, Any]:
        """`POST /v1/sessions` as the server answers it: `{session_id, agent_id, agent_name}`."""
        meta = {k: v for k, v in metadata.items() if v is not None}
        return await self._t.request("POST", "/v1/sessions", data={"metadata": json.dumps(meta)},
                                     files={"bundle": (filename, bundle, "application/gzip")})

    async def get(self, session_id: str) -> Session:
        return Session.from_dict(await self._t.request("GET", _path(session_id)))

    async def list(self, *, limit: int = 20, agent_name: str | None = None, order: str = "desc",
                   sort_by: str = "created_at", search_query: str | None = None) -> builtins.list[SessionListItem]:
        """Newest first by default; `sort_by="updated_at"` orders by last activity.

        `search_query`: only sessions with a message matching it (its words, or "quoted
        phrases", all in one message; words match as prefixes), newest first by creation,
        each with a `snippet`. An empty query is an `InvalidInputError`.
        """
        params: dict[str, Any] = {"limit": limit, "order": order, "sort_by": sort_by}
        if agent_name is not None:
            params["agent_name"] = agent_name
        if search_query is not None:
            params["search_query"] = search_query
        body = await self._t.request("GET", "/v1/sessions", params=params)
        return [SessionListItem.from_dict(row) for row in body["data"]]

    async def update(self, session_id: str, **fields: Any) -> Session:
        """`PATCH` any of `title`, `reasoning_effort`, `model_override`, `runner_id`, `permission_mode`."""
        return Session.from_dict(await self._t.request("PATCH", _path(session_id), json=fields))

    async def rename(self, session_id: str, title: str) -> Session:
        """Set the session's title."""
        return await self.update(session_id, title=title)

    async def fork(self, session_id: str, *, title: str | None = None,
                   up_to_response_id: str | None = None) -> Session:
        """A new session with a copy of this one's conversation (up to and including the item,
        or the response, `up_to_response_id`); `forked_from` names the source, which is unchanged.
        `NotFoundError` for an unknown session or item."""
        body = {k: v for k, v in {"title": title, "up_to_response_id": up_to_response_id}.items() if v is not None}
        return Session.from_dict(await self._t.request("POST", _path(session_id, "/fork"), json=body))

    async def delete(self, session_id: str) -> None:
        """Delete the session and all of it (a running turn is cancelled first; its streams end).
        `NotFoundError` when there is no such session."""
        await self._t.request("DELETE", _path(session_id))

    async def bind_runner(self, session_id: str, *, runner_id: str) -> Session:
        """Bind an online runner (400 `InvalidInputError` when it is not registered)."""
        return await self.update(session_id, runner_id=runner_id)

    async def unbind_runner(self, session_id: str) -> Session:
        return await self.update(session_id, runner_id="")

    async def list_items(self, session_id: str, *, limit: int = 100, after: str | None = None,
                         order: str = "asc") -> builtins.list[dict[str, Any]]:
        """One page of the conversation's items (wire form); `after` is an item id."""
        params: dict[str, Any] = {"limit": limit, "order": order}
        if after is not None:
            params["after"] = after
        return (await self._t.request("GET", _path(session_id, "/items"), params=params))["data"]

    async def all_items(self, session_id: str) -> builtins.list[dict[str, Any]]:
        """Every item, oldest first, paging as needed."""
        items: builtins.list[dict[str, Any]] = []
        after = None
        while True:
            params: dict[str, Any] = {"limit": 1000}
            if after:
                params["after"] = after
            page = await self._t.request("GET", _path(session_id, "/items"), params=params)
            items.extend(page["data"])
            if not page["has_more"]:
                return items
            after = page["last_id"]

    async def post_event(self, session_id: str, event: dict[str, Any]) -> dict[str, Any]:
        """Post a `message`, `interrupt`, `retry` or `approval` event; returns the server's body."""
        return await self._t.request("POST", _path(session_id, "/events"), json=event)

    async def send_message(self, session_id: str, content: str | builtins.list[dict[str, Any]], *,
                           approval_timeout: float | None = NOT_GIVEN) -> dict[str, Any]:
        """Queue a user message: `{queued, item_id, turn_id}`. Follow it with `stream`.

        `approval_timeout`: see `user_message` (not given: the server's default).
        """
        return await self.post_event(session_id, user_message(content, approval_timeout=approval_timeout))

    async def approve(self, session_id: str, approval_id: str, decision: str) -> dict[str, Any]:
        """Answer a pending approval: "allow", "deny" or "always" (this tool with this exact
        command or path, for the rest of the session). The first answer wins: a later one
        raises `ConflictError` (code `already_resolved`). Returns `{approval_id, decision, status}`."""
        return await self.post_event(session_id, {"type": "approval",
                                                  "data": {"approval_id": approval_id, "decision": decision}})

    async def approvals(self, session_id: str, status: str | None = None) -> builtins.list[dict[str, Any]]:
        """The session's approvals, oldest first; `status="pending"` for those waiting for an answer."""
        params = {"status": status} if status is not None else None
        return (await self._t.request("GET", _path(session_id, "/approvals"), params=params))["data"]

    async def permissions(self, session_id: str) -> builtins.list[dict[str, Any]]:
        """The session's "always" rules: `{id, tool, target, created_at}`, oldest first."""
        return (await self._t.request("GET", _path(session_id, "/permissions")))["data"]

    async def revoke(self, session_id: str, rule_id: str) -> None:
        """Remove one "always" rule (`NotFoundError` when the session has no such rule)."""
        await self._t.request("DELETE", _path(session_id, f"/permissions/{quote(rule_id, safe='')}"))

    async def interrupt(self, session_id: str) -> dict[str, Any]:
        """Cancel the running turn, if any (idempotent)."""
        return await self.post_event(session_id, {"type": "interrupt", "data": {}})

    def stream(self, session_id: str, after: int | None = None, *, heartbeats: bool = False,
               reconnect: bool = True) -> SessionStream:
        """The session's events after sequence number `after` (None: from now on), reconnecting."""
        return SessionStream(self._t, session_id, after, heartbeats=heartbeats, reconnect=reconnect)


__all__ = ["NOT_GIVEN", "SessionsNamespace", "message_text", "user_message"]
