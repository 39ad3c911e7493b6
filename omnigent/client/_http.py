"""The one HTTP transport under every namespace: httpx, JSON in and out, typed errors.

httpx runs on anyio, so the SDK works under trio and under asyncio alike.
Every call goes through `request`, which turns transport failures into
`APIConnectionError`, error statuses into the typed `APIStatusError`s and a
non-JSON success body into `ProtocolError`, so no httpx exception reaches
a caller.
"""

from __future__ import annotations

from typing import Any

import httpx

from ..config.tls import verify_for
from ._errors import ProtocolError, connection_error, error_for_status

ORIGIN = "omnigent://internal"  # the server's CSRF guard trusts this sentinel
# How long an idle connection is kept for the next request: past a person's pause between two
# prompts (httpx's 5 s made each prompt a new connection, and a TLS handshake to a remote server),
# and below the server's 75 s (`omnigent.server.connections.KEEP_ALIVE`), so that the client lets
# go first and never sends a request on a connection the server is closing.
KEEPALIVE_EXPIRY = 60.0
# httpx's own default pool, but for the expiry
_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=KEEPALIVE_EXPIRY)


class Transport:
    def __init__(self, base_url: str, *, headers: dict[str, str] | None, auth: Any,
                 timeout: float | httpx.Timeout | None, token: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        merged = {"Origin": ORIGIN}
        if token:
            merged["Authorization"] = f"Bearer {token}"
        merged.update(headers or {})
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=merged, auth=auth,
                                      timeout=timeout, verify=verify_for(self.base_url),
                                      limits=_LIMITS)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON body of a successful answer; raises the typed error otherwise."""
        resp = await self.send(method, path, **kwargs)
        try:
            return resp.json()
        except ValueError:
            raise ProtocolError(f"{method} {path}: the server sent a non-JSON answer "
                                f"({resp.headers.get('content-type') or 'no content type'})",
                                resp.status_code) from None

    async def send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The raw successful answer (for bodies that are not JSON)."""
        try:
            resp = await self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise connection_error(exc, self.base_url) from None
        if resp.status_code >= 400:
            raise error_for_status(resp.status_code, _json_or_none(resp), f"{method} {path}")
        return resp


def _json_or_none(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return None
