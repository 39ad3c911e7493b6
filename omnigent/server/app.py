"""The HTTP + websocket API: sessions, items, runners, event streams.

Routes are thin: they validate input into one error shape, call the store and
the turn service, and never let an exception out as a bare 500 page.
"""

from __future__ import annotations

import json
import logging
import re
from contextlib import aclosing
from typing import Any

import trio
from quart import Response, has_websocket_context, request, websocket
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

import protocol as p
from protocol import events as ev

from ..agents import SpecError
from ..link.runner_secrets import bearer, hash_secret, mint_runner_id, mint_secret
from ..store.errors import ConflictError, NotFoundError
from . import bodies, files, hosts
from .errors import ApiError, invalid, not_found
from .hub import HEARTBEAT_EVERY
from .runner_link import serve_runner
from .state import ServerState

log = logging.getLogger("omnigent.server")

EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
RUNNER_ID_RE = re.compile(r"runner_[A-Za-z0-9_-]{1,120}")
MAX_BODY = bodies.MAX_BODY


def create_app(state: ServerState) -> QuartTrio:
    app = QuartTrio("omnigent", static_folder=None)  # no /static route: the API serves no files
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY
    app.config["BODY_TIMEOUT"] = bodies.BODY_TIMEOUT
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    store = state.store
    bundle_limiter = trio.CapacityLimiter(1)  # bundles are read one at a time, off the loop

    # --- cross-cutting ------------------------------------------------------

    # answers given before the body was read: close the connection rather than keep it alive
    # with an unread body on it (hypercorn would wait on that body; see _drain_unread_body)
    early = {"Connection": "close"}

    @app.errorhandler(ApiError)
    async def _api_error(exc: ApiError):
        return exc.body(), exc.status, (early if exc.status in (408, 413, 415) else {})

    def _where() -> tuple[str, str]:
        """Method and path of what failed: handlers run for websockets too, with no `request`."""
        if has_websocket_context():
            return "WEBSOCKET", websocket.path
        return request.method, request.path

    @app.errorhandler(404)
    async def _no_route(_exc):
        method, path = _where()
        return ApiError("not_found", f"no route for {method} {path}").body(), 404

    @app.errorhandler(405)
    async def _bad_method(_exc):
        method, path = _where()
        return ApiError("method_not_allowed", f"{method} is not allowed on {path}").body(), 405

    @app.errorhandler(408)
    async def _slow_body(_exc):
        return ApiError("timeout", f"the request body did not arrive within {bodies.BODY_TIMEOUT} s").body(), 408, early

    @app.errorhandler(413)
    async def _too_large(_exc):
        return bodies.too_large(MAX_BODY).body(), 413, early

    @app.errorhandler(NotFoundError)
    async def _store_not_found(exc: NotFoundError):
        return ApiError("not_found", str(exc)).body(), 404

    @app.errorhandler(ConflictError)
    async def _store_conflict(exc: ConflictError):
        return ApiError("conflict", str(exc)).body(), 409

    @app.errorhandler(Exception)
    async def _crash(exc: Exception):
        code = getattr(exc, "code", None)
        if isinstance(code, int) and 400 <= code < 500:  # werkzeug/quart HTTPException
            return ApiError("invalid_input", getattr(exc, "description", str(exc))).body(), code
        method, path = _where()
        log.exception("unhandled error on %s %s", method, path)
        return ApiError("internal_error", "internal error").body(), 500

    def _check_origin(headers, *, needs_token: bool) -> None:
        """Browsers and rebinding names are refused first (guard.py), then a missing client token.

        Runner routes pass needs_token=False: they take the runner's own secret, never this token.
        """
        refusal = state.guard.origin_refusal(headers.get("Origin")) or state.guard.host_refusal(headers.get("Host"))
        if refusal:
            raise ApiError("forbidden", refusal)
        if needs_token and not state.client_token_ok(headers.get("Authorization")):
            raise ApiError("unauthorized", "missing or wrong bearer token")

    @app.after_request
    async def _drain_body(response):
        # a request answered before its body was read (a 404 on POST, say) must still have it
        # read before the answer goes out: hypercorn otherwise never recycles the keep-alive
        # connection, and the client's next request on it hangs until its timeout.
        # (_drain_unread_body covers what is left once the app has answered.)
        try:
            await request.get_data()
        except RequestEntityTooLarge:  # too big to drain: refuse it and close the connection
            response = Response(json.dumps(bodies.too_large(MAX_BODY).body()),
                                status=413, content_type="application/json", headers=early)
        except HTTPException:  # e.g. the rest of the body is too slow to come: keep the answer, close
            response.headers["Connection"] = "close"
        return response

    @app.before_request
    async def _guard():
        try:
            _check_origin(request.headers, needs_token=request.path != "/health")
        except ApiError as exc:
            # Refused before its body is read: the connection is closed after the answer, so
            # nothing is read from an untrusted peer, and keep-alive does not stall on the
            # unread body (hypercorn then stops serving that connection).
            return exc.body(), exc.status, {"Connection": "close"}

    # --- health -------------------------------------------------------------

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    # --- sessions -----------------------------------------------------------

    async def _upload_agent() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], bytes]:
        """Parse the multipart `bundle`; returns (named agent row, metadata, spec, bundle bytes).

        The named row (one per agent name: what new sessions start from and
        `--continue` finds) is created or updated, except by a resume
        (metadata `session_id`), which changes only that session and creates
        the named row only if there is none. What a session runs is pinned
        per session by the caller.
        """
        with trio.move_on_after(bodies.BODY_TIMEOUT) as slow:
            form = await request.form
            parts = await request.files
        if slow.cancelled_caught:
            raise ApiError("timeout", f"the upload did not arrive within {bodies.BODY_TIMEOUT} s")
        meta = bodies.parse_json(form.get("metadata") or "{}", "metadata")
        upload = parts.get("bundle")
        if upload is None:
            raise invalid("multipart part 'bundle' is missing")
        data = upload.read()
        try:
            spec = await bodies.parse_bundle(data, upload.filename or "bundle", bundle_limiter)
        except SpecError as exc:
            raise invalid(f"bad agent bundle: {exc}") from None
        spec_dict = spec.to_dict()
        agent = store.get_agent_by_name(spec.name) if meta.get("session_id") is not None else None
        if agent is None:
            agent = store.upsert_agent(spec.name, spec_dict, data)
        return agent, meta, spec_dict, data

    @app.post("/v1/agents")
    async def upload_agent():
        if request.mimetype != "multipart/form-data":
            raise ApiError("unsupported_media_type", "send the agent as a multipart/form-data 'bundle' part")
        agent, meta, spec, data = await _upload_agent()
        target = meta.get("session_id")
        if target is not None:
            # a resume: this session runs the upload from now on; no other session's spec changes
            if not isinstance(target, str):
                raise invalid("'session_id' must be a string")
            _conv(target)
            store.pin_session_agent(target, spec, data)
            return {"id": agent["id"], "name": agent["name"], "spec": spec, "session_id": target}, 200
        return {"id": agent["id"], "name": agent["name"], "spec": agent["spec"]}, 200

    @app.post("/v1/sessions")
    async def create_session():
        if request.mimetype == "multipart/form-data":
            agent, meta, spec, data = await _upload_agent()
            conv = _create(meta, agent)
            store.pin_session_agent(conv["id"], spec, data)  # exactly this upload, whatever came since
            return {"session_id": conv["id"], "agent_id": agent["id"], "agent_name": agent["name"]}, 201
        body = await _json_body()
        agent_id = body.get("agent_id")
        if not isinstance(agent_id, str):
            raise invalid("'agent_id' is required (or send a multipart bundle)")
        agent = store.get_agent(agent_id)
        if agent is None:
            raise not_found("Agent")
        conv = _create({k: v for k, v in body.items() if k != "agent_id"}, agent)
        return _session(conv["id"]), 201

    def _create(meta: dict[str, Any], agent: dict[str, Any]) -> dict[str, Any]:
        allowed = {"title", "labels", "reasoning_effort", "workspace", "model_override", "host_id"}
        extra = set(meta) - allowed
        if extra:
            raise invalid(f"unexpected metadata field {sorted(extra)[0]!r}")
        effort = meta.get("reasoning_effort")
        if effort is not None and effort not in EFFORTS:
            raise invalid(f"reasoning_effort must be one of {', '.join(EFFORTS)}")
        for key in ("title", "workspace", "model_override"):
            if meta.get(key) is not None and not isinstance(meta[key], str):
                raise invalid(f"{key!r} must be a string")
        host_id = meta.get("host_id")
        if host_id is not None and not isinstance(host_id, str):
            raise invalid("'host_id' must be a string")
        if host_id is not None and host_id != "host_local" and (
                (row := store.get_host(host_id)) is None or row["revoked_at"] is not None):
            raise not_found("Host")
        conv = store.create_conversation(
            agent_id=agent["id"], title=meta.get("title") or "", reasoning_effort=effort,
            model_override=meta.get("model_override"), workspace=meta.get("workspace"),
        )
        if host_id is not None:  # hosts: the session belongs to that host (server/hosts.py)
            store.set_conversation_host(conv["id"], host_id)
            conv = store.get_conversation(conv["id"])
        return conv

    @app.get("/v1/sessions")
    async def list_sessions():
        args = request.args
        limit = _int_arg("limit", 20, 1, 1000)
        order = args.get("order", "desc")
        sort_by = args.get("sort_by", "created_at")
        if order not in ("asc", "desc"):
            raise invalid("order must be asc or desc")
        if sort_by not in ("created_at", "updated_at"):
            raise invalid("sort_by must be created_at or updated_at")
        rows = store.list_conversations(limit=limit + 1, agent_name=args.get("agent_name"),
                                        order=order, sort_by=sort_by)
        has_more = len(rows) > limit
        data = [_list_item(r) for r in rows[:limit]]
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": has_more}

    @app.get("/v1/sessions/<session_id>")
    async def get_session(session_id: str):
        return _session(session_id)

    @app.patch("/v1/sessions/<session_id>")
    async def patch_session(session_id: str):
        _conv(session_id)
        body = await _json_body()
        known = {"runner_id", "title", "reasoning_effort", "model_override"}
        extra = set(body) - known
        if extra:
            raise invalid(f"unknown field {sorted(extra)[0]!r}")
        if "runner_id" in body:
            rid = body["runner_id"]
            if rid is not None and not isinstance(rid, str):
                raise invalid("'runner_id' must be a string")
            if rid and rid not in state.registry.online:
                raise invalid(f"runner '{rid}' is not registered")
            if rid and rid in state.isolated_runners and any(
                    other != session_id for other in store.conversations_for_runner(rid)):
                raise ApiError("conflict", f"runner '{rid}' is isolated: it serves one session only")
            store.set_runner(session_id, rid or None)  # a change bumps the session's generation
            state.turns.session_moved(session_id)  # a turn on the old runner is refused from now on
        fields = {}
        for key in ("title", "model_override"):
            if key in body:
                if body[key] is not None and not isinstance(body[key], str):
                    raise invalid(f"{key!r} must be a string")
                fields[key] = body[key] if key != "title" else (body[key] or "")
        if "reasoning_effort" in body:
            if body["reasoning_effort"] is not None and body["reasoning_effort"] not in EFFORTS:
                raise invalid(f"reasoning_effort must be one of {', '.join(EFFORTS)}")
            fields["reasoning_effort"] = body["reasoning_effort"]
        if fields:
            store.update_conversation(session_id, **fields)
        return _session(session_id)

    @app.post("/v1/sessions/<session_id>/events")
    async def post_event(session_id: str):
        conv = _conv(session_id)
        body = await _json_body()
        kind = body.get("type")
        if kind == "interrupt":
            return {"queued": False, "interrupted": await state.turns.interrupt(session_id)}, 202
        if kind == "retry":
            return _retry(session_id)
        if kind != "message":
            raise invalid("'type' must be 'message', 'interrupt' or 'retry'")
        data = body.get("data")
        if not isinstance(data, dict) or data.get("role", "user") != "user":
            raise invalid("'data' must be a user message object")
        files.reject_attachments(data.get("content"), store, conv)
        content = _content(data.get("content"))
        # stored now, or once the turn this one waits behind has answered (recovery, issue 7 §10)
        with state.hub.transaction(session_id) as tx:  # the message and its event commit together
            item, turn = store.queue_message(session_id, {"type": "message", "role": "user", "content": content})
            tx.publish(ev.INPUT_CONSUMED, item=item, turn_id=turn["id"])
        state.turns.submit(session_id)
        return {"queued": True, "item_id": item["id"], "turn_id": turn["id"]}, 202

    def _retry(session_id: str):
        """Run the newest interrupted turn again (one left by a crashed process, say)."""
        turns = store.list_turns(session_id)
        last = turns[-1] if turns else None
        if last is None or last["status"] not in ("interrupted", "failed"):
            raise ApiError("conflict", "the last turn of this session was not interrupted")
        turn = store.create_turn(session_id, last["input_item_id"])
        state.turns.submit(session_id)
        return {"queued": True, "item_id": last["input_item_id"], "turn_id": turn["id"]}, 202

    @app.get("/v1/sessions/<session_id>/items")
    async def list_items(session_id: str):
        _conv(session_id)
        limit = _int_arg("limit", 100, 1, 1000)
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
        _conv(session_id)
        return {"object": "list", "data": store.list_turns(session_id)}

    # --- event streams ------------------------------------------------------

    @app.get("/v1/sessions/<session_id>/stream")
    async def sse(session_id: str):
        """SSE: a greeting heartbeat, the events after `?after=N` (or `Last-Event-ID`), the live tail.

        Each logged event has an `id: <seq>` line, so a browser's EventSource
        resumes by itself; heartbeats (every 15 s of silence) have none.
        """
        _conv(session_id)
        after = _after_arg()
        if after is None:
            after = _last_event_id(request.headers.get("Last-Event-ID"))
        now = state.hub.last_seq(session_id)

        async def body():
            # the greeting states the newest number: live-only starts there, so nothing posted after it is missed
            yield _sse({"type": ev.HEARTBEAT, "session_id": session_id, "sequence_number": now})
            stream = state.hub.follow_batches(session_id, now if after is None else after,
                                              heartbeat=HEARTBEAT_EVERY)
            async with aclosing(stream):
                async for batch in stream:
                    yield b"".join(_sse(event) for event in batch)  # one write per burst
            yield b"data: [DONE]\n\n"

        return Response(body(), content_type="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.websocket("/v1/sessions/<session_id>/ws")
    async def session_ws(session_id: str):
        """The same stream as JSON text messages; `?after=N` replays. The client sends nothing."""
        try:
            _check_origin(websocket.headers, needs_token=True)
            _conv(session_id)
            after = _after_arg(websocket.args)
        except ApiError as exc:
            return exc.body(), exc.status
        await websocket.accept()
        async with trio.open_nursery() as n:
            n.start_soon(_close_on_shutdown, n)
            n.start_soon(_drain_client)
            now = state.hub.last_seq(session_id)
            await websocket.send(json.dumps({"type": ev.HEARTBEAT, "session_id": session_id,
                                             "sequence_number": now}))
            stream = state.hub.follow(session_id, now if after is None else after, heartbeat=HEARTBEAT_EVERY)
            async with aclosing(stream):
                async for event in stream:
                    await websocket.send(json.dumps(event))
            n.cancel_scope.cancel()

    async def _drain_client() -> None:
        while True:  # clients send nothing we need; reading notices a close
            await websocket.receive()

    async def _close_on_shutdown(n: trio.Nursery) -> None:
        await state.shutting_down.wait()
        await websocket.close(1001, "server shutting down")  # not 1006 after a 3 s hang (G1)
        n.cancel_scope.cancel()

    class _QuartTransport:
        async def receive(self):
            return await websocket.receive()

        async def send(self, text: str) -> None:
            await websocket.send(text)

        async def close(self, code: int, reason: str) -> None:
            await websocket.close(code, reason)

    # --- runners ------------------------------------------------------------

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
        body = await _json_body()
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
        """Only the secret bound to `runner_id` opens this (checked in serve_runner, 4003 otherwise)."""
        try:
            _check_origin(websocket.headers, needs_token=False)
        except ApiError as exc:
            return exc.body(), exc.status
        await websocket.accept()
        await serve_runner(state, runner_id, _QuartTransport(), bearer(websocket.headers.get("Authorization")))

    # --- helpers ------------------------------------------------------------

    def _conv(session_id: str) -> dict[str, Any]:
        conv = store.get_conversation(session_id)
        if conv is None:
            raise ApiError("not_found", "Session not found")
        return conv

    def _session(session_id: str) -> dict[str, Any]:
        conv = _conv(session_id)
        body = _list_item(conv)
        spec = store.session_spec(session_id)  # what this session runs, not the latest upload of its name
        body.update(llm_model=conv.get("model_override") or spec.get("model"),
                    harness=spec.get("harness"), model_override=conv.get("model_override"),
                    last_sequence_number=state.hub.last_seq(session_id),
                    host_id=store.conversation_host(session_id))
        return body

    def _list_item(conv: dict[str, Any]) -> dict[str, Any]:
        rid = conv.get("runner_id")
        return {
            "id": conv["id"], "object": "session", "agent_id": conv.get("agent_id"),
            "agent_name": conv.get("agent_name"), "status": state.turns.status(conv["id"]),
            "created_at": conv["created_at"], "updated_at": conv["updated_at"],
            "title": conv.get("title") or "", "item_count": conv.get("item_count") or 0,
            "message_count": conv.get("message_count") or 0,
            "labels": {}, "runner_id": rid,
            "runner_online": bool(rid and rid in state.registry.online),
            "reasoning_effort": conv.get("reasoning_effort"), "workspace": conv.get("workspace"),
        }

    _json_body = bodies.json_body

    def _int_arg(name: str, default: int, lo: int, hi: int) -> int:
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

    def _after_arg(args=None) -> int | None:
        raw = (args if args is not None else request.args).get("after")
        if raw is None:
            return None
        try:
            return int(raw)
        except ValueError:
            raise invalid("after must be an integer sequence number") from None

    def _content(content: Any) -> list[dict[str, Any]]:
        if isinstance(content, str):
            content = [{"type": "input_text", "text": content}]
        if not isinstance(content, list) or not content:
            raise invalid("message content must be a non-empty list of parts or a string")
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "input_text" or not isinstance(part.get("text"), str):
                raise invalid("message content parts must be {'type': 'input_text', 'text': str}")
        return content

    files.register(app, state)
    hosts.register(app, state)
    app.asgi_app = _drain_unread_body(app.asgi_app)
    return app


def _drain_unread_body(asgi_app):
    """Read and drop what is left of a request body once the route has answered.

    A route may answer before the body is in (413, 415, a bad id). hypercorn
    0.18 then wedges the connection: its reader blocks handing chunks to the
    app's full queue, and the close waits behind it, so the client that sent
    a 40 MiB body got its 413 but never a close. Consuming the rest until the
    body ends (or the client leaves) lets hypercorn finish the exchange.
    """
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return await asgi_app(scope, receive, send)
        ended = False

        async def tracked():
            nonlocal ended
            message = await receive()
            ended = message["type"] == "http.disconnect" or not message.get("more_body", False)
            return message

        await asgi_app(scope, tracked, send)
        while not ended:  # bounded by the client: it finishes sending or goes away
            await tracked()

    return app


def _sse(event: dict[str, Any]) -> bytes:
    seq = event.get("sequence_number") if event["type"] != ev.HEARTBEAT else None
    head = f"id: {seq}\n" if isinstance(seq, int) else ""
    return f"{head}event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def _last_event_id(raw: str | None) -> int | None:
    """The SSE reconnect header: a sequence number we sent, or nothing usable (then: live)."""
    if raw is None:
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise ApiError("invalid_input", "Last-Event-ID must be an integer sequence number") from None

