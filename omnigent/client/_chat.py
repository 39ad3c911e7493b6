"""`SessionsChat`: one turn at a time on a session, as events or as a finished answer.

`send` subscribes to the session's stream first and waits for the server's
heartbeat, so it cannot miss the turn's first events, then posts the message
and yields the turn's events until the one that ends it. `query` runs `send`
and returns the answer's text: the text deltas, or when there were none, the
assistant messages of `output_item.done`, or the completed response's output.
Events of other turns on the same session are skipped, not yielded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ._errors import ProtocolError, TurnFailedError
from ._events import Event, Heartbeat, ItemDone, ResponseCompleted, ResponseCreated, TextDelta, message_text
from ._sessions import NOT_GIVEN, SessionsNamespace, user_message
from ._types import File, QueryResult, Session


class TurnText:
    """Accumulates the answer of one turn from its events (a retried attempt starts over)."""

    def __init__(self) -> None:
        self._deltas: list[str] = []
        self._items: list[str] = []
        self.text = ""

    def add(self, event: Event) -> None:
        if isinstance(event, ResponseCreated):
            self._deltas.clear()
            self._items.clear()
        elif isinstance(event, TextDelta):
            self._deltas.append(event.delta)
        elif isinstance(event, ItemDone) and event.item.get("type") == "message":
            self._items.append(message_text(event.item))
        elif isinstance(event, ResponseCompleted):
            output = event.response.get("output") or []
            self.text = "".join(self._deltas) or "".join(self._items) or "".join(
                message_text(i) for i in output if isinstance(i, dict) and i.get("type") == "message")


class SessionsChat:
    """Chat on one session. The constructor makes no request."""

    def __init__(self, *, namespace: SessionsNamespace, session: Session | str,
                 files_uploader: Callable[..., Awaitable[File]] | None = None,
                 files_getter: Callable[[str], Awaitable[File]] | None = None) -> None:
        self._sessions = namespace
        self.session_id = session if isinstance(session, str) else session.id
        self._upload = files_uploader
        self._get_file = files_getter

    async def send(self, input: str | list[dict[str, Any]], *, files: list[str] | None = None,
                   approval_timeout: float | None = NOT_GIVEN) -> AsyncIterator[Event]:
        """Post one user message and yield its turn's events, ending with the terminal one.

        `approval_timeout`: see `user_message` (not given: the server's default).
        """
        message = user_message(input, approval_timeout=approval_timeout)
        content: list[dict[str, Any]] = message["data"]["content"]
        for path in files or ():
            if self._upload is None:
                raise TypeError("files= needs a files_uploader")
            uploaded = await self._upload(path)
            content.append({"type": "input_file", "file_id": uploaded.id})
        stream = self._sessions.stream(self.session_id, heartbeats=True)
        async with stream:
            first = await stream.__anext__()
            if not isinstance(first, Heartbeat):  # the server always greets with one
                raise ProtocolError(f"stream {self.session_id}: expected a heartbeat first, got {first.type}")
            posted = await self._sessions.post_event(self.session_id, message)
            turn_id = posted.get("turn_id")
            async for event in stream:
                if isinstance(event, Heartbeat):
                    continue
                if event.turn_id is not None and turn_id is not None and event.turn_id != turn_id:
                    continue
                yield event
                if event.is_terminal:
                    return

    async def query(self, input: str | list[dict[str, Any]], *, files: list[str] | None = None,
                    approval_timeout: float | None = NOT_GIVEN) -> QueryResult:
        """Run one turn and return its answer; a failed turn raises `TurnFailedError`."""
        text = TurnText()
        turn_id = None
        async for event in self.send(input, files=files, approval_timeout=approval_timeout):
            turn_id = event.turn_id or turn_id
            text.add(event)
            if event.type == "response.failed":
                error = event.data.get("error") or {}
                raise TurnFailedError(error.get("message") or "the turn failed", None, error.get("code"))
            if event.type in ("response.cancelled", "response.incomplete"):
                return QueryResult(text="", status="cancelled", turn_id=turn_id)
        return QueryResult(text=text.text, status="completed", turn_id=turn_id)

    async def cancel(self) -> dict[str, Any]:
        """Interrupt the running turn (idempotent)."""
        return await self._sessions.interrupt(self.session_id)

    async def refresh(self) -> Session:
        return await self._sessions.get(self.session_id)
