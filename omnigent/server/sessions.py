"""Agent and session routes: upload an agent, create, list, show and change sessions.

- `POST /v1/agents`: a multipart `bundle` (and `metadata`); with `metadata.session_id`
  a resume, which pins the upload to that session only.
- `POST /v1/sessions`: from a multipart bundle or from `{agent_id, ...}`; the session
  runs exactly the spec it was created with, whatever is uploaded under its name later.
- `GET /v1/sessions` (`?search_query=` searches the text of messages: each row gains a
  `snippet`), `GET /v1/sessions/{id}` (with the session's summed `usage`),
  `PATCH /v1/sessions/{id}` (binding to a runner, title, reasoning effort, model
  override, permission mode).
- `POST /v1/sessions/{id}/fork` (201: the new session, `forked_from` set; store/catalog.py)
  and `DELETE /v1/sessions/{id}`: its turn cancelled through the turn service and its
  worker stopped first, then every row of it removed, then its watchers' streams ended.
- `permission_mode` (ask | auto | deny | null: the agent spec's) is the session's own
  mode. It can only make the session stricter than its host allows: the loop runs
  the strictest of it and the host's policy (server/agent_loop.py).

Every field is validated into one 4xx error before the store is touched.
"""

from __future__ import annotations

from typing import Any

import trio
from quart import request

from ..agents import SpecError
from ..store.errors import NotFoundError
from . import bodies
from ._routes import conversation, int_arg
from .errors import ApiError, invalid, not_found
from .state import ServerState

EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
PERMISSION_MODES = ("ask", "auto", "deny")


def _permission_mode(value: Any) -> str | None:
    if value is not None and value not in PERMISSION_MODES:
        raise invalid(f"permission_mode must be one of {', '.join(PERMISSION_MODES)}, or null")
    return value


def register(app: Any, state: ServerState) -> None:
    store = state.store
    bundle_limiter = trio.CapacityLimiter(1)  # bundles are read one at a time, off the loop

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
            conversation(state, target)
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
        body = await bodies.json_body()
        agent_id = body.get("agent_id")
        if not isinstance(agent_id, str):
            raise invalid("'agent_id' is required (or send a multipart bundle)")
        agent = store.get_agent(agent_id)
        if agent is None:
            raise not_found("Agent")
        conv = _create({k: v for k, v in body.items() if k != "agent_id"}, agent)
        return _session(conv["id"]), 201

    def _create(meta: dict[str, Any], agent: dict[str, Any]) -> dict[str, Any]:
        allowed = {"title", "labels", "reasoning_effort", "workspace", "model_override", "host_id",
                   "permission_mode"}
        extra = set(meta) - allowed
        if extra:
            raise invalid(f"unexpected metadata field {sorted(extra)[0]!r}")
        effort = meta.get("reasoning_effort")
        if effort is not None and effort not in EFFORTS:
            raise invalid(f"reasoning_effort must be one of {', '.join(EFFORTS)}")
        for key in ("title", "workspace", "model_override"):
            if meta.get(key) is not None and not isinstance(meta[key], str):
                raise invalid(f"{key!r} must be a string")
        mode = _permission_mode(meta.get("permission_mode"))
        host_id = meta.get("host_id")
        if host_id is not None and not isinstance(host_id, str):
            raise invalid("'host_id' must be a string")
        if host_id is not None and host_id != "host_local" and (
                (row := store.get_host(host_id)) is None or row["revoked_at"] is not None):
            raise not_found("Host")
        conv = store.create_conversation(
            agent_id=agent["id"], title=meta.get("title") or "", reasoning_effort=effort,
            model_override=meta.get("model_override"), workspace=meta.get("workspace"), permission_mode=mode,
        )
        if host_id is not None:  # hosts: the session belongs to that host (server/hosts.py)
            store.set_conversation_host(conv["id"], host_id)
            conv = store.get_conversation(conv["id"]) or conv
        return conv

    @app.get("/v1/sessions")
    async def list_sessions():
        args = request.args
        limit = int_arg("limit", 20, 1, 1000)
        order = args.get("order", "desc")
        sort_by = args.get("sort_by", "created_at")
        if order not in ("asc", "desc"):
            raise invalid("order must be asc or desc")
        if sort_by not in ("created_at", "updated_at"):
            raise invalid("sort_by must be created_at or updated_at")
        query = args.get("search_query")
        extra: dict[str, Any] = {}
        if query is not None:  # newest first, by creation (order and sort_by do not apply)
            try:
                rows = store.search_conversations(query, agent_name=args.get("agent_name"), limit=limit + 1)
            except ValueError as exc:
                raise invalid(f"search_query: {exc}") from None
            extra = {"search_mode": store.search_mode, "search_note": store.search_note}
        else:
            rows = store.list_conversations(limit=limit + 1, agent_name=args.get("agent_name"),
                                            order=order, sort_by=sort_by)
        has_more = len(rows) > limit
        data = [_list_item(r) for r in rows[:limit]]
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": has_more, **extra}

    @app.post("/v1/sessions/<session_id>/fork")
    async def fork_session(session_id: str):
        conversation(state, session_id)
        body = await bodies.json_body()
        extra = set(body) - {"title", "up_to_response_id"}
        if extra:
            raise invalid(f"unknown field {sorted(extra)[0]!r}")
        for key in ("title", "up_to_response_id"):
            if body.get(key) is not None and not isinstance(body[key], str):
                raise invalid(f"{key!r} must be a string")
        try:
            fork = store.fork_conversation(session_id, title=body.get("title"),
                                           up_to_response_id=body.get("up_to_response_id") or None)
        except NotFoundError as exc:  # the item; or the session, deleted meanwhile
            raise ApiError("not_found", str(exc)) from None
        return _session(fork["id"]), 201

    @app.delete("/v1/sessions/<session_id>")
    async def delete_session(session_id: str):
        conversation(state, session_id)
        await state.turns.end_session(session_id)  # nothing of it runs or writes from here on
        try:
            store.delete_conversation(session_id)
        except NotFoundError:  # deleted meanwhile (another request, another process)
            raise not_found("Session") from None
        state.hub.end_session(session_id)  # after the rows: a watcher that reconnects gets 404
        state.registry.notify_changed()  # its runner's load changed (placement re-reads bindings)
        return {"id": session_id, "object": "session.deleted", "deleted": True}

    @app.get("/v1/sessions/<session_id>")
    async def get_session(session_id: str):
        return _session(session_id)

    @app.patch("/v1/sessions/<session_id>")
    async def patch_session(session_id: str):
        conversation(state, session_id)
        body = await bodies.json_body()
        known = {"runner_id", "title", "reasoning_effort", "model_override", "permission_mode"}
        extra = set(body) - known
        if extra:
            raise invalid(f"unknown field {sorted(extra)[0]!r}")
        mode = _permission_mode(body.get("permission_mode"))  # checked before anything is written
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
        fields: dict[str, Any] = {}
        for key in ("title", "model_override"):
            if key in body:
                if body[key] is not None and not isinstance(body[key], str):
                    raise invalid(f"{key!r} must be a string")
                fields[key] = body[key] if key != "title" else (body[key] or "")
        if "reasoning_effort" in body:
            if body["reasoning_effort"] is not None and body["reasoning_effort"] not in EFFORTS:
                raise invalid(f"reasoning_effort must be one of {', '.join(EFFORTS)}")
            fields["reasoning_effort"] = body["reasoning_effort"]
        if "permission_mode" in body:
            fields["permission_mode"] = mode
        if fields:
            store.update_conversation(session_id, **fields)
        return _session(session_id)

    def _session(session_id: str) -> dict[str, Any]:
        conv = conversation(state, session_id)
        body = _list_item(conv)
        spec = store.session_spec(session_id)  # what this session runs, not the latest upload of its name
        body.update(llm_model=conv.get("model_override") or spec.get("model"),
                    harness=spec.get("harness"), model_override=conv.get("model_override"),
                    last_sequence_number=state.hub.last_seq(session_id),
                    host_id=store.conversation_host(session_id), usage=store.session_usage(session_id))
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
            "permission_mode": conv.get("permission_mode"), "forked_from": conv.get("forked_from"),
            **({"snippet": conv["snippet"]} if "snippet" in conv else {}),
        }
