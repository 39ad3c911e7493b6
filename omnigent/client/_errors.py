"""Typed errors: one base class, one subclass per thing a caller may handle differently.

Every failure the SDK raises is an `OmnigentError`, so `except OmnigentError`
is always enough. The server's answer decides the subclass: its HTTP status,
with the `{"error": {"code", "message"}}` body supplying `code` and the
message. Nothing is classified by matching message text.

    OmnigentError                 base; .message, .status_code, .code
    ├── APIStatusError            the server answered with a 4xx/5xx
    │   ├── InvalidInputError     400
    │   ├── AuthenticationError   401 and 403
    │   ├── NotFoundError         404
    │   ├── ConflictError         409
    │   └── ServerError           5xx
    ├── APIConnectionError        the server could not be reached (refused, reset, timed out)
    ├── ProtocolError             the server answered something this client cannot read
    └── TurnFailedError           a turn ended in `response.failed` (SessionsChat.query)
"""

from __future__ import annotations

from typing import Any

import httpx


class OmnigentError(Exception):
    """Base of every error the SDK raises."""

    def __init__(self, message: str, status_code: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.code = code

    def __str__(self) -> str:
        return self.message


class APIStatusError(OmnigentError):
    """The server answered with an error status; `status_code` and `code` say which."""


class InvalidInputError(APIStatusError):
    """400: the request was malformed or refused as invalid."""


class AuthenticationError(APIStatusError):
    """401/403: a missing or wrong bearer token, or a refused origin or host."""


class NotFoundError(APIStatusError):
    """404: no such session, file or route."""


class ConflictError(APIStatusError):
    """409: the request conflicts with the current state (e.g. nothing to retry)."""


class ServerError(APIStatusError):
    """5xx: the server failed; retrying later may work."""


class APIConnectionError(OmnigentError):
    """The server could not be reached or the connection broke before an answer."""


class ProtocolError(OmnigentError):
    """The server's answer is not what the API promises (say, a non-JSON body)."""


class TurnFailedError(OmnigentError):
    """A turn ended with `response.failed`; `code` is the server's error code."""


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: InvalidInputError,
    401: AuthenticationError,
    403: AuthenticationError,
    404: NotFoundError,
    409: ConflictError,
}


def error_for_status(status_code: int, body: Any, what: str) -> APIStatusError:
    """The typed error for an error answer; `what` ("GET /v1/...") names it when the body does not."""
    err = body.get("error") if isinstance(body, dict) else None
    err = err if isinstance(err, dict) else {}
    message = err.get("message") if isinstance(err.get("message"), str) else None
    code = err.get("code") if isinstance(err.get("code"), str) else None
    cls = _BY_STATUS.get(status_code) or (ServerError if status_code >= 500 else APIStatusError)
    return cls(message or f"{what}: HTTP {status_code}", status_code, code)


def connection_error(exc: httpx.TransportError, base_url: str) -> APIConnectionError:
    return APIConnectionError(f"cannot reach the omnigent server at {base_url}: {exc or type(exc).__name__}")
