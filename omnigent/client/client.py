"""`OmnigentClient`: the one client of an omnigent server, for the SDK and the CLI alike.

It knows the API's shapes and nothing of the server's insides, so the REPL
works the same against the in-process server of `omnigent run` and against a
remote `omnigent server`. It runs on httpx and anyio: under trio (the CLI)
and under asyncio (SDK users) alike, and importing it loads no server code.

The SDK surface is the namespaces (`sessions`, `files`, `runners`, `hosts`), which
return typed resources. The flat methods below them (`create_session`,
`get_session`, `run_turn`, `events`, ...) are the dict-level calls the CLI and
the REPL make; each is a thin layer over the same transport and streams.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from protocol import ProtocolError as _WireError
from protocol import decode_event
from protocol import events as ev

from ._chat import SessionsChat, TurnText
from ._errors import OmnigentError
from ._events import message_text, parse_event
from ._files import FilesNamespace
from ._hosts import HostsNamespace
from ._http import Transport
from ._sessions import NOT_GIVEN, SessionsNamespace


class RunnersNamespace:
    """`client.runners`: which runners are online."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    async def list(self) -> list[dict[str, Any]]:
        return (await self.pool())["data"]

    async def pool(self) -> dict[str, Any]:
        """Online runners (`data`) and, if the host stopped replacing them, why (`gave_up`)."""
        return await self._t.request("GET", "/v1/runners")

    async def status(self, runner_id: str) -> dict[str, Any]:
        return await self._t.request("GET", f"/v1/runners/{runner_id}/status")


class OmnigentClient:
    """An async context manager; `aclose()` (or leaving the `async with`) closes its connections.

    `headers` are sent on every request, `auth` is any httpx auth, `token` is
    shorthand for `Authorization: Bearer <token>`; `timeout` bounds each
    request (streams wait longer: see `SessionStream`).
    """

    def __init__(self, base_url: str, *, headers: dict[str, str] | None = None, auth: Any = None,
                 timeout: float | httpx.Timeout | None = 30.0, token: str | None = None) -> None:
        self._t = Transport(base_url, headers=headers, auth=auth, timeout=timeout, token=token)
        self.base_url = self._t.base_url
        self.sessions = SessionsNamespace(self._t)
        self.files = FilesNamespace(self._t)
        self.runners = RunnersNamespace(self._t)
        self.hosts = HostsNamespace(self._t)

    async def __aenter__(self) -> OmnigentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._t.aclose()

    async def health(self) -> dict[str, Any]:
        return await self._t.request("GET", "/health")

    # --- the CLI's dict-level calls ----------------------------------------

    async def create_session(self, bundle: bytes, *, filename: str = "agent.tar.gz",
                             permission_mode: str | None = None, **metadata: Any) -> dict[str, Any]:
        """`permission_mode` (ask | auto | deny; None: the spec's) is the session's own mode."""
        created = await self.sessions.create_raw(bundle, filename=filename, permission_mode=permission_mode,
                                                 **metadata)
        return await self.get_session(created["session_id"])

    async def upload_agent(self, bundle: bytes, *, filename: str = "agent.tar.gz",
                           session_id: str | None = None) -> dict[str, Any]:
        """Register or update (by name) the agent; with `session_id`, pin it to that session only.

        A resumed session runs the spec it is given here (its `--model` and
        `--harness` overrides included); no other session's spec changes.
        """
        import json

        meta = json.dumps({"session_id": session_id} if session_id else {})
        return await self._t.request("POST", "/v1/agents", data={"metadata": meta},
                                     files={"bundle": (filename, bundle, "application/gzip")})

    async def get_session(self, session_id: str) -> dict[str, Any]:
        return (await self.sessions.get(session_id)).raw

    async def list_sessions(self, *, limit: int = 20, agent_name: str | None = None,
                            order: str = "desc", sort_by: str = "created_at") -> list[dict[str, Any]]:
        rows = await self.sessions.list(limit=limit, agent_name=agent_name, order=order, sort_by=sort_by)
        return [row.raw for row in rows]

    async def patch_session(self, session_id: str, **fields: Any) -> dict[str, Any]:
        return (await self.sessions.update(session_id, **fields)).raw

    async def bind_runner(self, session_id: str, runner_id: str) -> dict[str, Any]:
        return await self.patch_session(session_id, runner_id=runner_id)

    async def post_message(self, session_id: str, text: str, *,
                           approval_timeout: float | None = NOT_GIVEN) -> dict[str, Any]:
        return await self.sessions.send_message(session_id, text, approval_timeout=approval_timeout)

    async def approve(self, session_id: str, approval_id: str, decision: str) -> dict[str, Any]:
        return await self.sessions.approve(session_id, approval_id, decision)

    async def interrupt(self, session_id: str) -> dict[str, Any]:
        return await self.sessions.interrupt(session_id)

    async def retry(self, session_id: str) -> dict[str, Any]:
        return await self.sessions.post_event(session_id, {"type": "retry"})

    async def list_items(self, session_id: str) -> list[dict[str, Any]]:
        return await self.sessions.all_items(session_id)

    async def list_turns(self, session_id: str) -> list[dict[str, Any]]:
        return (await self._t.request("GET", f"/v1/sessions/{session_id}/turns"))["data"]

    async def list_runners(self) -> list[dict[str, Any]]:
        return await self.runners.list()

    async def runner_pool(self) -> dict[str, Any]:
        return await self.runners.pool()

    async def runner_status(self, runner_id: str) -> dict[str, Any]:
        return await self.runners.status(runner_id)

    @asynccontextmanager
    async def events(self, session_id: str, after: int | None = None) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        """One connection's events as dicts, the heartbeat first; it ends when the connection does.

        Opening waits for the heartbeat, so a failure to subscribe (no such
        session, server down) raises here, and a message posted afterwards
        cannot be missed. Event types this client does not know are skipped.
        The REPL reconnects by itself; SDK users want `sessions.stream`.
        """
        stream = self.sessions.stream(session_id, after, heartbeats=True, reconnect=False)
        async with stream:
            first = await stream.__anext__()

            async def dicts() -> AsyncGenerator[dict[str, Any], None]:
                yield first.data
                async for event in stream:
                    try:
                        yield decode_event(event.data)
                    except _WireError:
                        continue  # a newer server's event the renderer does not know

            gen = dicts()
            try:
                yield gen
            finally:
                await gen.aclose()

    async def run_turn(self, session_id: str, text: str, *,
                       on_event: Callable[[dict[str, Any]], None] | None = None,
                       approval_timeout: float | None = NOT_GIVEN) -> TurnResult:
        """Send a message and follow its turn to the end, reporting every event on the way.

        `approval_timeout=0` for a caller that cannot ask anyone (`-p` without a terminal).
        """
        chat = SessionsChat(namespace=self.sessions, session=session_id)
        result = TurnResult(turn_id="", status="lost")
        return await _collect(chat.send(text, approval_timeout=approval_timeout), result, on_event)


@dataclass
class TurnResult:
    turn_id: str
    status: str                     # completed | failed | cancelled | lost
    text: str = ""
    error: dict[str, Any] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)


async def follow_turn(stream: AsyncIterator[dict[str, Any]], turn_id: str,
                      on_event: Callable[[dict[str, Any]], None] | None = None) -> TurnResult:
    """Follow one turn on a dict stream (from `events`) to its end."""

    async def typed() -> AsyncIterator[Any]:
        async for raw in stream:
            event = parse_event(raw)
            if event.turn_id not in (turn_id, None):
                continue
            yield event
            if event.is_terminal:
                return

    return await _collect(typed(), TurnResult(turn_id=turn_id, status="lost"), on_event)


async def _collect(events: AsyncIterator[Any], result: TurnResult,
                   on_event: Callable[[dict[str, Any]], None] | None) -> TurnResult:
    text = TurnText()
    async for event in events:
        if event.type == ev.HEARTBEAT:
            continue
        result.turn_id = event.turn_id or result.turn_id
        result.events.append(event.data)
        if on_event is not None:
            on_event(event.data)
        text.add(event)
        if event.type == ev.COMPLETED:
            result.status, result.text = "completed", text.text
            return result
        if event.type == ev.FAILED:
            result.status, result.error = "failed", event.data.get("error")
            return result
        if event.type == ev.CANCELLED:
            result.status = "cancelled"
            return result
    result.error = {"code": "stream_closed", "message": "the server closed the event stream mid-turn"}
    return result


__all__ = ["OmnigentClient", "OmnigentError", "RunnersNamespace", "TurnResult", "follow_turn",
           "message_text"]
