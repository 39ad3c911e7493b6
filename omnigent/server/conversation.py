"""A session's conversation routes: what a client posts into it and reads back.

- `POST /v1/sessions/{id}/events`: `message` (stored with its `input.consumed`
  event in one transaction, then a turn is queued: 202; its `approval_timeout`,
  seconds or null for "until answered", is stored on the turn), `interrupt` (the
  running or waiting turn is cancelled), `retry` (the newest interrupted, failed or
  cancelled turn runs again; one with stored steps goes on from them as the same turn) or
  `approval` (an answer to a pending approval: server/approvals.py).
- `GET /v1/sessions/{id}/items` (paged, `after`/`order`/`limit`) and `GET /v1/sessions/{id}/turns`.

The turns themselves run in `turns.TurnService`; these routes only queue and read.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

from quart import request

from ..config.timeline import mark, stamp
from ..config.tuning import Tuning, tuning_from_env
from ..store.errors import NotFoundError
from . import approvals, bodies, files
from ._routes import conversation, int_arg
from .errors import ApiError, invalid
from .state import ServerState


# What reads a route's JSON body: `bodies.json_body` under quart, the front's own reader (front.py)
ReadJson = Callable[[], Awaitable[dict[str, Any]]]
# `POST /v1/sessions/{id}/events` without its framework: (session id, the body's reader, the time the
# request reached the route, `stamp()`) -> (the answer's JSON, its status)
PostEvent = Callable[[str, ReadJson, "float | None"], Awaitable[tuple[dict[str, Any], int]]]


def events_route(state: ServerState) -> PostEvent:
    """`POST /v1/sessions/{id}/events`, free of quart: every turn a client starts is one, so the
    front serves it as bare ASGI (front.py); quart's rule for it serves the same function."""
    store = state.store
    default_timeout = _default_approval_timeout(state)

    async def post_event(session_id: str, read_json: ReadJson, entered: float | None) -> tuple[dict[str, Any], int]:
        # `entered` and `bodied`: the timeline's points of a message's way in (marked once its turn is made)
        conv = conversation(state, session_id, counts=False)  # a post reads no count
        body = await read_json()
        bodied = stamp()
        kind = body.get("type")
        if kind == "interrupt":
            return {"queued": False, "interrupted": await state.turns.interrupt(session_id)}, 202
        if kind == "retry":
            return _retry(session_id, body.get("data"))
        if kind == "approval":
            return await approvals.answer(state, session_id, body.get("data"))
        if kind != "message":
            raise invalid("'type' must be 'message', 'interrupt', 'retry' or 'approval'")
        data = body.get("data")
        if not isinstance(data, dict) or data.get("role", "user") != "user":
            raise invalid("'data' must be a user message object")
        timeout = _approval_timeout(data, default_timeout)
        files.reject_attachments(data.get("content"), store, conv)
        content = _content(data.get("content"))
        # stored now, or once the turn this one waits behind has answered (recovery, issue 7 §10)
        item, turn = state.turns.queue_message(  # the message and its events commit together
            session_id, {"type": "message", "role": "user", "content": content}, approval_timeout=timeout)
        if entered is not None:
            mark(f"turn.entered:{turn['id']}", at=entered)
            mark(f"turn.bodied:{turn['id']}", at=bodied)
        mark(f"turn.stored:{turn['id']}")
        state.turns.submit(session_id)
        await state.hub.dispatched(session_id)  # the TurnStart goes out before this answer does
        return {"queued": True, "item_id": item["id"], "turn_id": turn["id"]}, 202

    def _retry(session_id: str, data: Any):
        """Run the newest interrupted turn again (one left by a crashed process, say).

        A turn with stored steps is queued again as itself, so the loop goes on
        from its first unfinished step: nothing it stored runs twice. That is
        also how a turn cancelled mid-tool continues. Any other interrupted, failed or
        cancelled turn runs afresh as a new turn on the same message. `data` may
        carry the `approval_timeout` of whoever retries (as on a message).
        """
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise invalid("'data' of a retry must be an object")
        timeout = _approval_timeout(data, default_timeout)
        turns = store.list_turns(session_id)
        last = turns[-1] if turns else None
        if last is not None and last["step"] is not None and last["status"] in ("interrupted", "failed", "cancelled"):
            turn = (store.requeue_turn(last["id"], approval_timeout=timeout) if "approval_timeout" in data
                    else store.requeue_turn(last["id"]))
            state.turns.submit(session_id)
            return {"queued": True, "item_id": last["input_item_id"], "turn_id": turn["id"], "resumed": True}, 202
        if last is None or last["status"] not in ("interrupted", "failed", "cancelled"):  # cancelled while queued
            raise ApiError("conflict", "the last turn of this session was not interrupted, failed or cancelled")
        turn = store.create_turn(session_id, last["input_item_id"], approval_timeout=timeout)
        state.turns.submit(session_id)
        return {"queued": True, "item_id": last["input_item_id"], "turn_id": turn["id"]}, 202

    return post_event


def register(app: Any, state: ServerState, post_event: PostEvent) -> None:
    store = state.store

    @app.post("/v1/sessions/<session_id>/events")
    async def post_event_route(session_id: str):
        """Reached only when quart is driven without its front (its own `handle_request`): the
        front answers this method on this path first. The rule stays in quart's map for the
        rest: its 405 for other methods, and the route lists that the fuzz and docs read."""
        return await post_event(session_id, bodies.json_body, stamp())

    @app.get("/v1/sessions/<session_id>/items")
    async def list_items(session_id: str):
        conversation(state, session_id)
        limit = int_arg("limit", 100, 1, 1000)
        order = request.args.get("order", "asc")
        if order not in ("asc", "desc"):
            raise invalid("order must be asc or desc")
        after = request.args.get("after")
        try:
            rows = store.list_items(session_id, limit=limit + 1, after=after, order=order)
        except NotFoundError:
            raise invalid(f"after: no item {after!r} in this session") from None
        data = rows[:limit]
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": len(rows) > limit}

    @app.get("/v1/sessions/<session_id>/turns")
    async def list_turns(session_id: str):
        conversation(state, session_id)
        return {"object": "list", "data": store.list_turns(session_id)}


def _default_approval_timeout(state: ServerState) -> float:
    """`Tuning.approval_timeout` of this server (`OMNIGENT_APPROVAL_TIMEOUT`, checked at start)."""
    given = getattr(state, "approval_timeout", None)
    if isinstance(given, (int, float)):
        return float(given)
    try:
        return tuning_from_env().approval_timeout
    except ValueError:  # the CLI refused it before anything started; a test's server falls back
        return Tuning().approval_timeout


def _approval_timeout(data: dict[str, Any], default: float) -> float | None:
    """Absent: the server's default; null: until answered; a number >= 0 (0: refuse at once)."""
    if "approval_timeout" not in data:
        return default
    value = data["approval_timeout"]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise invalid("'approval_timeout' must be a number of seconds >= 0, or null to wait until answered")
    return float(value)


def _content(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        content = [{"type": "input_text", "text": content}]
    if not isinstance(content, list) or not content:
        raise invalid("message content must be a non-empty list of parts or a string")
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "input_text" or not isinstance(part.get("text"), str):
            raise invalid("message content parts must be {'type': 'input_text', 'text': str}")
    return content
