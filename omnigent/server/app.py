"""The HTTP + websocket API, built: the error shape, the guard and body draining around every route.

The routes live in one module per concern (`sessions`, `conversation`,
`streams`, `runners`, `files`, `hosts`), each registered on the app here;
the message post, the runner websocket and the two session streams are
answered in front of quart (`front`), with the same guarantees.
What this module guarantees for all of them: every error leaves as one JSON
shape (never a bare 500 page), a browser origin, a rebinding Host or a
missing token is refused before any body is read, and a request answered
before its body arrived still has that body drained, so keep-alive
connections do not stall.
"""

from __future__ import annotations

import json
import logging

from quart import Response, has_websocket_context, request, websocket
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from ..store.errors import ConflictError, NotFoundError
from . import approvals, bodies, conversation, files, hosts, runners, sessions, streams
from ._routes import check_origin
from .errors import ApiError, of_store
from .front import with_front
from .state import ServerState

log = logging.getLogger("omnigent.server")

MAX_BODY = bodies.MAX_BODY


def create_app(state: ServerState) -> QuartTrio:
    app = QuartTrio("omnigent", static_folder=None)  # no /static route: the API serves no files
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY
    app.config["BODY_TIMEOUT"] = bodies.BODY_TIMEOUT
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False

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
    @app.errorhandler(ConflictError)
    async def _store_error(exc: Exception):
        error = of_store(exc)
        assert error is not None  # registered for exactly the errors of_store maps
        return error.body(), error.status

    @app.errorhandler(Exception)
    async def _crash(exc: Exception):
        code = getattr(exc, "code", None)
        if isinstance(code, int) and 400 <= code < 500:  # werkzeug/quart HTTPException
            return ApiError("invalid_input", getattr(exc, "description", str(exc))).body(), code
        method, path = _where()
        log.exception("unhandled error on %s %s", method, path)
        return ApiError("internal_error", "internal error").body(), 500

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
            check_origin(state, request.headers, needs_token=request.path != "/health")
        except ApiError as exc:
            # Refused before its body is read: the connection is closed after the answer, so
            # nothing is read from an untrusted peer, and keep-alive does not stall on the
            # unread body (hypercorn then stops serving that connection).
            return exc.body(), exc.status, {"Connection": "close"}

    # --- health -------------------------------------------------------------

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    post_event = conversation.events_route(state)
    sessions.register(app, state)
    conversation.register(app, state, post_event)
    streams.register(app, state)
    runners.register(app, state)
    files.register(app, state)
    hosts.register(app, state)
    approvals.register(app, state)
    # ASGI middleware, as quart documents: the hot routes in front of quart (front.py), and what is
    # left of any body drained once the answer is out
    app.asgi_app = _drain_unread_body(with_front(app.asgi_app, state, post_event))  # type: ignore[method-assign]
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

