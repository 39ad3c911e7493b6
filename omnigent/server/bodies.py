"""Request bodies read within bounds: size while reading, shape before parsing, slow work off the loop.

Every body a client sends ends as a value or one 4xx `ApiError`, never a 5xx:
- JSON routes take `Content-Type: application/json` only (415 otherwise), so a
  web page cannot reach them with a CORS "simple" request (`text/plain`, forms);
- a body is read chunk by chunk and refused (413) as soon as it passes its
  limit, so an oversized one is never held in memory whole;
- JSON is measured before it is parsed (`protocol.jsonobj`): too many values
  (413) or too deep (400) is refused without building anything, so a parse
  holds the event loop for a few milliseconds at most;
- an agent bundle (gzip, tar, YAML: pure-Python work that may take seconds on
  a hostile upload) is read in a worker thread, one at a time, so the event
  loop keeps serving everyone else meanwhile.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterable
from typing import Any

import trio
from quart import request

from protocol import ProtocolError
from protocol.jsonobj import load_object

from ..agents import AgentSpec, spec_from_bundle
from ..agents.spec import MAX_BYTES
from .errors import ApiError, invalid

MAX_JSON_BODY = 1024 * 1024      # a JSON request: a message, a patch (a model's context is smaller)
MAX_JSON_VALUES = 10_000         # values in one JSON request or multipart metadata
MAX_JSON_DEPTH = 32              # nesting of one JSON request
MAX_BODY = MAX_BYTES + 1024 * 1024  # any request: a bundle at its limit plus multipart framing
BODY_TIMEOUT = 30                # seconds to receive a whole body (quart's default is 60)

def require_json() -> None:
    check_json_type(request.mimetype)


def check_json_type(mimetype: str | None) -> None:
    """415 unless the request's media type (lower-cased, parameters left out) is application/json."""
    if mimetype != "application/json":
        got = mimetype or "no Content-Type"
        raise ApiError("unsupported_media_type", f"send this request as application/json (got {got})")


async def read_body(limit: int) -> bytes:
    """The whole body, refused with 413 once it passes `limit` bytes (before it is all read)."""
    return await read_chunks(request.body, request.content_length, limit)


async def read_chunks(chunks: AsyncIterable[bytes], content_length: int | None, limit: int) -> bytes:
    """A body from its chunks, bounded: 413 when its Content-Length or what has arrived passes
    `limit` (nothing past it is held), 408 when it is not all in within BODY_TIMEOUT."""
    if content_length is not None and content_length > limit:
        raise too_large(limit)
    data = bytearray()
    with trio.move_on_after(BODY_TIMEOUT) as scope:
        async for chunk in chunks:
            data += chunk
            if len(data) > limit:
                raise too_large(limit)
    if scope.cancelled_caught:
        raise ApiError("timeout", f"the request body did not arrive within {BODY_TIMEOUT} s")
    return bytes(data)


async def json_body() -> dict[str, Any]:
    """The JSON object a JSON route was sent (an empty body is `{}`)."""
    require_json()
    raw = await read_body(MAX_JSON_BODY)
    return parse_json(raw or b"{}", "request body")


def parse_json(raw: str | bytes, what: str) -> dict[str, Any]:
    try:
        body = load_object(raw, what, max_depth=MAX_JSON_DEPTH, max_values=MAX_JSON_VALUES)
    except ProtocolError as exc:
        if exc.close_code == ProtocolError.TOO_LARGE:
            raise ApiError("too_large", exc.reason) from None
        raise invalid(exc.reason) from None
    try:  # a lone surrogate ('\ud800') parses, but no store or log could write it
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise invalid(f"{what} holds a string that is not valid Unicode (a lone surrogate)") from None
    return body


async def parse_bundle(data: bytes, name_hint: str, limiter: trio.CapacityLimiter) -> AgentSpec:
    """`spec_from_bundle` in a worker thread, as many at once as `limiter` allows.

    SpecError passes through. The thread cannot be cancelled, but its work is
    bounded (`agents.bundle`: member count, unpacked size, YAML events).
    """
    return await trio.to_thread.run_sync(
        functools.partial(spec_from_bundle, data, name_hint=name_hint), limiter=limiter)


def too_large(limit: int) -> ApiError:
    return ApiError("too_large", f"request body over {limit} bytes")
