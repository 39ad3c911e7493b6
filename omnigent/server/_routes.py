"""What several route modules share: the session lookup, integer query args, the origin check.

Kept in one place so every route refuses the same way: an unknown session is
404 "Session not found", a bad integer argument is 400, and a browser origin,
a rebinding Host or a missing client token is refused before anything else.
"""

from __future__ import annotations

from typing import Any

from quart import request

from .errors import ApiError, invalid
from .state import ServerState


def conversation(state: ServerState, session_id: str, *, counts: bool = True) -> dict[str, Any]:
    """The session's row; 404 when there is none. `counts=False`: without `message_count` (it reads
    every item of the session), for the routes that only need the row."""
    conv = state.store.get_conversation(session_id, counts=counts)
    if conv is None:
        raise ApiError("not_found", "Session not found")
    return conv


def int_arg(name: str, default: int, lo: int, hi: int) -> int:
    """An integer query argument of the current request, within [lo, hi]."""
    raw = request.args.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise invalid(f"{name} must be an integer") from None
    if not lo <= value <= hi:
        raise invalid(f"{name} must be between {lo} and {hi}")
    return value


def check_origin(state: ServerState, headers: Any, *, needs_token: bool) -> None:
    """Browsers and rebinding names are refused first (guard.py), then a missing client token.

    Runner routes pass needs_token=False: they take the runner's own secret, never this token.
    """
    refusal = state.guard.origin_refusal(headers.get("Origin")) or state.guard.host_refusal(headers.get("Host"))
    if refusal:
        raise ApiError("forbidden", refusal)
    if needs_token and not state.client_token_ok(headers.get("Authorization")):
        raise ApiError("unauthorized", "missing or wrong bearer token")
