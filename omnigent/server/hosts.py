"""Host routes: register, list, show and revoke hosts; ask a host for a runner; the host websocket.

- `POST /v1/hosts {name?, workspace_roots?, capacity?}` -> 201 `{host_id, host_secret}`; the
  secret is returned once, only its sha256 is stored.
- `GET /v1/hosts`, `GET /v1/hosts/{id}`: online or offline, its online runners, capacity,
  roots, generation. A revoked host is not found. The in-process host (`host_local`) is
  listed while this server has one.
- `DELETE /v1/hosts/{id}`: revoked; its live link is closed with 4003, its runners are dropped
  and their secrets revoked (their sessions move on as after any runner loss).
- `POST /v1/hosts/{id}/runners {session_id?, workspace?}`: a `LaunchRunner` on that host's
  link, then (at most `state.launch_timeout` s) its `LaunchResult`. On success the session is
  bound to the new runner (online or not yet: a turn waits for it) and records the host and
  workspace. The host alone decides where a runner may start (`workspace_not_allowed`).
- `GET /v1/hosts/{id}/ws`: the host link (`host_link.serve_host`), opened by the host secret.

Client routes take the client token (the app's `before_request` guard); the websocket takes
the host secret, and is guarded against browser origins like every websocket route.
"""

from __future__ import annotations

import uuid
from typing import Any

import trio
from quart import websocket

import protocol as p

from ..link.runner_secrets import bearer, hash_secret, mint_secret
from ._routes import conversation
from .bodies import json_body
from .errors import ApiError, invalid, not_found
from .host_link import revoke_host as revoke
from .host_link import serve_host
from .registry import LOCAL_HOST
from .quart_compat import CLIENT_DISCONNECTED
from .state import ServerState

MAX_ROOTS = 64
MAX_PATH = 4096
MAX_CAPACITY = 10_000
_LAUNCH_ERRORS = {"workspace_not_allowed", "at_capacity", "launch_failed"}


def register(app: Any, state: ServerState) -> None:
    store = state.store
    registry = state.registry

    def _local() -> dict[str, Any] | None:
        if not state.host_events.links:
            return None
        return {"host_id": LOCAL_HOST, "name": "local", "status": "online", "online": True,
                "runners": registry.host_runners(LOCAL_HOST), "capacity": 0, "workspace_roots": [],
                "generation": 0, "last_seen_at": None}

    def _view(row: dict[str, Any]) -> dict[str, Any]:
        conn = registry.hosts.get(row["id"])
        return {"host_id": row["id"], "name": row["name"], "status": "online" if conn else "offline",
                "online": conn is not None, "runners": registry.host_runners(row["id"]),
                "capacity": row["capacity"], "workspace_roots": row["workspace_roots"],
                "generation": row["generation"], "last_seen_at": row["last_seen_at"]}

    def _live_host(host_id: str) -> dict[str, Any]:
        """The host's view; 404 when unknown or revoked."""
        if host_id == LOCAL_HOST:
            local = _local()
            if local is not None:
                return local
        row = store.get_host(host_id) if host_id.startswith("host_") else None
        if row is None or row["revoked_at"] is not None:
            raise not_found("Host")
        return _view(row)

    async def create_host():
        body = await json_body()
        _only(body, {"name", "workspace_roots", "capacity"})
        name = body.get("name", "")
        if not isinstance(name, str) or len(name) > 200 or not name.isprintable():
            raise invalid("'name' must be a printable string of at most 200 characters")
        roots = body.get("workspace_roots", [])
        if not isinstance(roots, list) or len(roots) > MAX_ROOTS or not all(_absolute(r) for r in roots):
            raise invalid(f"'workspace_roots' must be a list of at most {MAX_ROOTS} absolute paths")
        capacity = body.get("capacity", 0)
        if isinstance(capacity, bool) or not isinstance(capacity, int) or not 0 <= capacity <= MAX_CAPACITY:
            raise invalid(f"'capacity' must be a whole number from 0 to {MAX_CAPACITY} (0: no bound)")
        secret = mint_secret()
        row = store.create_host(hash_secret(secret), name=name, workspace_roots=roots, capacity=capacity)
        return {"host_id": row["id"], "host_secret": secret}, 201

    async def list_hosts():
        local = _local()
        data = ([local] if local else []) + [_view(r) for r in store.list_hosts()]
        return {"object": "list", "data": data}

    async def get_host(host_id: str):
        return _live_host(host_id)

    async def revoke_host(host_id: str):
        if host_id == LOCAL_HOST:
            raise ApiError("forbidden", "the in-process host cannot be revoked")
        _live_host(host_id)
        revoke(state, host_id)
        return {"host_id": host_id, "revoked": True}

    async def launch_runner(host_id: str):
        host = _live_host(host_id)
        body = await json_body()
        _only(body, {"session_id", "workspace"})
        session_id, workspace = body.get("session_id"), body.get("workspace")
        if session_id is not None and not isinstance(session_id, str):
            raise invalid("'session_id' must be a string")
        if workspace is not None and not _absolute(workspace):
            raise invalid("'workspace' must be an absolute path")
        if session_id is not None:
            conv = conversation(state, session_id)
            workspace = workspace or conv.get("workspace")
        if not registry.host_online(host_id) or (host_id == LOCAL_HOST and not state.host_events.links):
            raise ApiError("host_offline", f"host {host_id} is offline")
        if host["capacity"] and _running(host_id) >= host["capacity"]:
            raise ApiError("at_capacity", f"host {host_id} runs its {host['capacity']} runners already")
        result = await _launch(host_id, session_id, workspace)
        if result.error_code is not None or not result.runner_id:
            code = result.error_code if result.error_code in _LAUNCH_ERRORS else "launch_failed"
            raise ApiError(code, result.message or f"host {host_id} could not launch a runner ({code})")
        if session_id is not None:
            store.set_runner(session_id, result.runner_id)
            store.set_conversation_host(session_id, host_id, workspace=workspace)
            registry.notify_changed()  # a turn waiting for a runner re-reads its binding
        return {"runner_id": result.runner_id, "host_id": host_id, "session_id": session_id}, 201

    def _running(host_id: str) -> int:
        """Runners of this host online now or launched and on their way."""
        return sum(1 for rid in set(registry.pids) | set(registry.online)
                   if registry.host_of(rid) == host_id and (rid in registry.online or registry.launching(rid)))

    async def _launch(host_id: str, session_id: str | None, workspace: str | None) -> p.LaunchResult:
        request_id = f"launch_{uuid.uuid4().hex}"
        send, recv = trio.open_memory_channel[p.LaunchResult](1)
        state.launches[request_id] = send
        try:
            if not state.host_events.launch_runner(
                    host_id, p.LaunchRunner(request_id=request_id, session_id=session_id, workspace=workspace)):
                raise ApiError("host_offline", f"host {host_id} is offline")
            with trio.move_on_after(state.launch_timeout):
                return await recv.receive()
        finally:
            del state.launches[request_id]
        raise ApiError("launch_timeout", f"host {host_id} did not answer the launch within "
                                         f"{state.launch_timeout:g} s")

    async def host_ws(host_id: str):
        """Only the secret of `host_id` opens this (checked in serve_host, 4003 otherwise)."""
        refusal = (state.guard.origin_refusal(websocket.headers.get("Origin"))
                   or state.guard.host_refusal(websocket.headers.get("Host")))
        if refusal:
            return ApiError("forbidden", refusal).body(), 403
        await websocket.accept()
        try:
            await serve_host(state, host_id, _Transport(), bearer(websocket.headers.get("Authorization")))
        except* (ConnectionError, *CLIENT_DISCONNECTED):  # type: ignore[misc]  # mypy: a starred tuple
            pass  # the host went away (quart 0.23 raises on receive; 0.22 cancels the handler)

    app.add_url_rule("/v1/hosts", "hosts_create", create_host, methods=["POST"])
    app.add_url_rule("/v1/hosts", "hosts_list", list_hosts, methods=["GET"])
    app.add_url_rule("/v1/hosts/<host_id>", "hosts_get", get_host, methods=["GET"])
    app.add_url_rule("/v1/hosts/<host_id>", "hosts_revoke", revoke_host, methods=["DELETE"])
    app.add_url_rule("/v1/hosts/<host_id>/runners", "hosts_launch", launch_runner, methods=["POST"])
    app.add_websocket("/v1/hosts/<host_id>/ws", "hosts_ws", host_ws)


def _only(body: dict[str, Any], known: set[str]) -> None:
    extra = set(body) - known
    if extra:
        raise invalid(f"unknown field {sorted(extra)[0]!r}")


def _absolute(path: Any) -> bool:
    return isinstance(path, str) and path.startswith("/") and 0 < len(path) <= MAX_PATH and "\0" not in path


class _Transport:
    """quart's websocket as a `runner_link.Transport`; a peer that is gone is a ConnectionError."""

    async def receive(self):
        return await websocket.receive()

    async def send(self, text: str) -> None:
        try:
            await websocket.send(text)
        except Exception as exc:  # hypercorn's UnexpectedMessageError: the peer closed meanwhile
            if type(exc).__name__ != "UnexpectedMessageError":
                raise
            raise ConnectionError("the host closed the link") from None

    async def close(self, code: int, reason: str) -> None:
        try:
            await websocket.close(code, reason)
        except Exception as exc:
            if type(exc).__name__ != "UnexpectedMessageError":
                raise
