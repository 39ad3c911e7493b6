"""HTTP (httpx) and websocket (trio-websocket) access to an omnigent server.

It knows the API's shapes and nothing of the server's insides, so the REPL
works the same against the in-process server of `omnigent run` and against a
remote `omnigent server`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import httpx
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from protocol import MAX_FRAME_BYTES, ProtocolError, decode_event
from protocol import events as ev


class OmnigentError(Exception):
    def __init__(self, message: str, status_code: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.code = code


@dataclass
class TurnResult:
    turn_id: str
    status: str                     # completed | failed | cancelled
    text: str = ""
    error: dict[str, Any] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)


def message_text(item: dict[str, Any]) -> str:
    """The visible text of a message item (input or output parts)."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(
        part.get("text", "") for part in content or ()
        if isinstance(part, dict) and part.get("type") in ("output_text", "input_text", "text")
    )


class OmnigentClient:
    def __init__(self, base_url: str, *, token: str | None = None, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Origin": "omnigent://internal"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=self._headers, timeout=timeout)

    async def __aenter__(self) -> OmnigentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise OmnigentError(f"cannot reach the omnigent server at {self.base_url}: {exc}") from None
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.status_code >= 400:
            err = (body or {}).get("error") if isinstance(body, dict) else None
            err = err if isinstance(err, dict) else {}
            raise OmnigentError(err.get("message") or f"{method} {path}: HTTP {resp.status_code}",
                                resp.status_code, err.get("code"))
        if body is None:
            raise OmnigentError(f"{method} {path}: the server sent a non-JSON answer")
        return body

    # --- sessions -----------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        return await self._call("GET", "/health")

    async def create_session(self, bundle: bytes, *, filename: str = "agent.tar.gz",
                             **metadata: Any) -> dict[str, Any]:
        meta = {k: v for k, v in metadata.items() if v is not None}
        created = await self._call("POST", "/v1/sessions", data={"metadata": json.dumps(meta)},
                                   files={"bundle": (filename, bundle, "application/gzip")})
        return await self.get_session(created["session_id"])

    async def upload_agent(self, bundle: bytes, *, filename: str = "agent.tar.gz") -> dict[str, Any]:
        """Register or update (by name) the agent so resumed sessions run the current spec."""
        return await self._call("POST", "/v1/agents", data={"metadata": "{}"},
                                files={"bundle": (filename, bundle, "application/gzip")})

    async def get_session(self, session_id: str) -> dict[str, Any]:
        return await self._call("GET", f"/v1/sessions/{session_id}")

    async def list_sessions(self, *, limit: int = 20, agent_name: str | None = None,
                            order: str = "desc", sort_by: str = "created_at") -> list[dict[str, Any]]:
        params = {"limit": limit, "order": order, "sort_by": sort_by}
        if agent_name is not None:
            params["agent_name"] = agent_name
        return (await self._call("GET", "/v1/sessions", params=params))["data"]

    async def patch_session(self, session_id: str, **fields: Any) -> dict[str, Any]:
        return await self._call("PATCH", f"/v1/sessions/{session_id}", json=fields)

    async def bind_runner(self, session_id: str, runner_id: str) -> dict[str, Any]:
        return await self.patch_session(session_id, runner_id=runner_id)

    async def post_message(self, session_id: str, text: str) -> dict[str, Any]:
        event = {"type": "message", "data": {"role": "user",
                                             "content": [{"type": "input_text", "text": text}]}}
        return await self._call("POST", f"/v1/sessions/{session_id}/events", json=event)

    async def interrupt(self, session_id: str) -> dict[str, Any]:
        return await self._call("POST", f"/v1/sessions/{session_id}/events",
                                json={"type": "interrupt", "data": {}})

    async def retry(self, session_id: str) -> dict[str, Any]:
        return await self._call("POST", f"/v1/sessions/{session_id}/events", json={"type": "retry"})

    async def list_items(self, session_id: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        after = None
        while True:
            params: dict[str, Any] = {"limit": 1000}
            if after:
                params["after"] = after
            page = await self._call("GET", f"/v1/sessions/{session_id}/items", params=params)
            items.extend(page["data"])
            if not page["has_more"]:
                return items
            after = page["last_id"]

    async def list_turns(self, session_id: str) -> list[dict[str, Any]]:
        return (await self._call("GET", f"/v1/sessions/{session_id}/turns"))["data"]

    # --- runners ------------------------------------------------------------

    async def list_runners(self) -> list[dict[str, Any]]:
        return (await self.runner_pool())["data"]

    async def runner_pool(self) -> dict[str, Any]:
        """Online runners (`data`) and, if the host stopped replacing them, why (`gave_up`)."""
        return await self._call("GET", "/v1/runners")

    async def runner_status(self, runner_id: str) -> dict[str, Any]:
        return await self._call("GET", f"/v1/runners/{runner_id}/status")

    # --- events -------------------------------------------------------------

    @asynccontextmanager
    async def events(self, session_id: str, after: int | None = None) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        """A live event stream; the first event is a heartbeat carrying the current sequence number."""
        ws_url = "ws" + self.base_url[4:] + f"/v1/sessions/{session_id}/ws"
        if after is not None:
            ws_url += "?" + urlencode({"after": after})
        try:
            async with open_websocket_url(ws_url, extra_headers=list(self._headers.items()),
                                          connect_timeout=10, disconnect_timeout=2,
                                          max_message_size=MAX_FRAME_BYTES) as ws:
                async def stream() -> AsyncIterator[dict[str, Any]]:
                    while True:
                        try:
                            raw = await ws.get_message()
                        except ConnectionClosed:
                            return
                        try:
                            yield decode_event(raw)
                        except ProtocolError:
                            continue  # a newer server's event this client does not know
                yield stream()
        except (OSError, trio.TooSlowError) as exc:
            raise OmnigentError(f"cannot open the event stream of {session_id}: {exc}") from None

    async def run_turn(self, session_id: str, text: str, *,
                       on_event: Callable[[dict[str, Any]], None] | None = None) -> TurnResult:
        """Send a message and follow its turn to the end, reporting every event on the way."""
        async with self.events(session_id) as stream:
            await anext(stream)  # the heartbeat: we are subscribed before the message exists
            posted = await self.post_message(session_id, text)
            return await follow_turn(stream, posted["turn_id"], on_event)


async def follow_turn(stream: AsyncIterator[dict[str, Any]], turn_id: str,
                      on_event: Callable[[dict[str, Any]], None] | None = None) -> TurnResult:
    result = TurnResult(turn_id=turn_id, status="lost")
    deltas: list[str] = []
    items: list[str] = []
    async for event in stream:
        if event.get("turn_id") not in (turn_id, None):
            continue
        result.events.append(event)
        if on_event is not None:
            on_event(event)
        kind = event["type"]
        if kind == ev.RESPONSE_CREATED:
            deltas.clear()  # a retried attempt starts the answer over
            items.clear()
        elif kind == ev.TEXT_DELTA:
            deltas.append(event["delta"])
        elif kind == ev.ITEM_DONE and event["item"].get("type") == "message":
            items.append(message_text(event["item"]))
        elif kind == ev.COMPLETED:
            output = event["response"].get("output") or []
            result.status = "completed"
            result.text = "".join(deltas) or "".join(items) or "".join(
                message_text(i) for i in output if i.get("type") == "message")
            return result
        elif kind == ev.FAILED:
            result.status, result.error = "failed", event["error"]
            return result
        elif kind == ev.CANCELLED:
            result.status = "cancelled"
            return result
    result.error = {"code": "stream_closed", "message": "the server closed the event stream mid-turn"}
    return result
