"""API errors as one JSON shape: {"error": {"code", "message"}} with a 4xx/5xx status."""

from __future__ import annotations

from ..store.errors import ConflictError, NotFoundError

STATUS = {
    "invalid_input": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "conflict": 409,
    "already_resolved": 409,  # an approval answered twice (server/approvals.py)
    "timeout": 408,
    "too_large": 413,
    "unsupported_media_type": 415,
    "runner_unavailable": 503,
    # host routes (server/hosts.py)
    "workspace_not_allowed": 403,
    "host_offline": 409,
    "at_capacity": 409,
    "launch_failed": 409,
    "launch_timeout": 408,
    "internal_error": 500,
}


class ApiError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = STATUS[code]

    def body(self) -> dict:
        return {"error": {"code": self.code, "message": self.message}}


def not_found(what: str) -> ApiError:
    return ApiError("not_found", f"{what} not found")


def invalid(message: str) -> ApiError:
    return ApiError("invalid_input", message)


def of_store(exc: Exception) -> ApiError | None:
    """The API's answer to a store error that a route let through (404, 409); None for any other."""
    if isinstance(exc, NotFoundError):
        return ApiError("not_found", str(exc))
    if isinstance(exc, ConflictError):
        return ApiError("conflict", str(exc))
    return None
