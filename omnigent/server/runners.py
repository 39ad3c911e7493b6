"""Runner routes: list the online runners, register an explicit one, its status, the runner websocket.

- `GET /v1/runners`, `GET /v1/runners/{id}/status`.
- `POST /v1/runners {runner_id?, runner_secret?, isolate?}` -> 201 `{runner_id, runner_secret}`.
- `GET /v1/runners/{id}/ws`: the runner link (`runner_link.serve_runner`), opened by
  the secret bound to that id, never by the client token.
"""

from __future__ import annotations

import re
from typing import Any

from quart import websocket

from ..link.runner_secrets import bearer, hash_secret, mint_runner_id, mint_secret
from . import bodies
from ._routes import check_origin
from .errors import ApiError, invalid
from .quart_compat import CLIENT_DISCONNECTED, QuartSocket
from .runner_link import serve_runner
from .state import ServerState

RUNNER_ID_RE = re.compile(r"runner_[A-Za-z0-9_-]{1,120}")


def register(app: Any, state: ServerState) -> None:
    store = state.store

    @app.get("/v1/runners")
    async def runners():
        return {"object": "list", "data": [
            {"runner_id": c.runner_id, "online": True, "pid": c.pid, "harnesses": c.harnesses,
             "explicit": c.explicit}
            for c in state.registry.online.values()
        ], "gave_up": state.registry.gave_up}

    @app.post("/v1/runners")
    async def register_runner():
        """A client registers a new *explicit* runner: an id and the secret bound to it.

        Optional `runner_id` / `runner_secret` in the body; what is absent is
        minted. `isolate: true` makes a runner that serves exactly one session:
        binding a second session to it is refused with 409 (kept in memory only:
        after a server restart the runner is a plain explicit one). The secret is returned once and only its hash is kept. Explicit
        runners never take part in placement: they serve the sessions a client
        binds to them with `PATCH /v1/sessions/{id} {runner_id}`.
        """
        body = await bodies.json_body()
        extra = set(body) - {"runner_id", "runner_secret", "isolate"}
        if extra:
            raise invalid(f"unknown field {sorted(extra)[0]!r}")
        isolate = body.get("isolate", False)
        if not isinstance(isolate, bool):
            raise invalid("'isolate' must be true or false")
        runner_id = body.get("runner_id") or mint_runner_id()
        secret = body.get("runner_secret") or mint_secret()
        if not isinstance(runner_id, str) or not RUNNER_ID_RE.fullmatch(runner_id):
            raise invalid("'runner_id' must look like runner_<letters, digits, _ or -> (at most 127 characters)")
        if not isinstance(secret, str) or not 32 <= len(secret) <= 512 or not secret.isprintable():
            raise invalid("'runner_secret' must be a printable string of 32 to 512 characters")
        known = runner_id in state.registry.online or runner_id in state.registry.pids
        if known or not store.add_runner_credential(runner_id, hash_secret(secret), kind="explicit"):
            raise ApiError("conflict", f"runner id '{runner_id}' is already known")
        if isolate:
            state.isolated_runners.add(runner_id)
        state.registry.notify_changed()
        return {"runner_id": runner_id, "runner_secret": secret}, 201

    @app.get("/v1/runners/<runner_id>/status")
    async def runner_status(runner_id: str):
        return state.registry.status(runner_id)

    @app.websocket("/v1/runners/<runner_id>/ws")
    async def runner_ws(runner_id: str):
        """Only the secret bound to `runner_id` opens this (checked in serve_runner, 4003 otherwise).

        Reached only when quart is driven without its front: the front serves this path as bare
        ASGI (`asgi_socket.py`), over the same `serve_runner`."""
        try:
            check_origin(state, websocket.headers, needs_token=False)
        except ApiError as exc:
            return exc.body(), exc.status
        await websocket.accept()
        try:
            await serve_runner(state, runner_id, QuartSocket(), bearer(websocket.headers.get("Authorization")))
        except* CLIENT_DISCONNECTED:
            pass  # the runner went away (quart 0.23 raises on receive/send; 0.22 cancels the handler)
