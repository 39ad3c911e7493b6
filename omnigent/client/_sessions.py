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


def _path(session_id: str, tail: str = "") -> str:
    return f"/v1/sessions/{quote(session_id, safe='')}{tail}"


def user_message(content: str | builtins.list[dict[str, Any]]) -> dict[str, Any]:
    """The `message` event for a user turn; a string becomes one `input_text` part."""
    if isinstance(content, str):
        content = [{"type": "input_text", "text": content}]
    return {"type": "message", "data": {"role": "user", "content": content}}


class SessionsNamespace:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    async def create(self, bundle: bytes, *, filename: str = "agent.tar.gz", title: str | None = None,
                     labels: dict[str, str] | None = None, reasoning_effort: str | None = None,
                     workspace: str | None = None) -> Session:
        """Upload an agent bundle (a gzip tarball, see `omnigent.cli._bundle`) and start a session on it."""
        meta = {k: v for k, v in {"title": title, "labels": labels, "reasoning_effort": reasoning_effort,
                                  "workspace": workspace}.items() if v is not None}
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
                   sort_by: str = "created_at") -> builtins.list[SessionListItem]:
        """Newest first by default; `sort_by="updated_at"` orders by last activity."""
        params: dict[str, Any] = {"limit": limit, "order": order, "sort_by": sort_by}
        if agent_name is not None:
            params["agent_name"] = agent_name
        body = await self._t.request("GET", "/v1/sessions", params=params)
        return [SessionListItem.from_dict(row) for row in body["data"]]

    async def update(self, session_id: str, **fields: Any) -> Session:
        """`PATCH` any of `title`, `reasoning_effort`, `model_override`, `runner_id`."""
        return Session.from_dict(await self._t.request("PATCH", _path(session_id), json=fields))

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
        """Post a `message`, `interrupt` or `retry` event; returns the server's 202 body."""
        return await self._t.request("POST", _path(session_id, "/events"), json=event)

    async def send_message(self, session_id: str, content: str | builtins.list[dict[str, Any]]) -> dict[str, Any]:
        """Queue a user message: `{queued, item_id, turn_id}`. Follow it with `stream`."""
        return await self.post_event(session_id, user_message(content))

    async def interrupt(self, session_id: str) -> dict[str, Any]:
        """Cancel the running turn, if any (idempotent)."""
        return await self.post_event(session_id, {"type": "interrupt", "data": {}})

    def stream(self, session_id: str, after: int | None = None, *, heartbeats: bool = False,
               reconnect: bool = True) -> SessionStream:
        """The session's events after sequence number `after` (None: from now on), reconnecting."""
        return SessionStream(self._t, session_id, after, heartbeats=heartbeats, reconnect=reconnect)


__all__ = ["SessionsNamespace", "message_text", "user_message"]
