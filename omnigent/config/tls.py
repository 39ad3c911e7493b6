"""What a client gives httpx to verify TLS with, when its base URL is plain HTTP.

httpx builds an SSL context for every client it makes, loading the CA bundle:
~50 ms of CPU on a slow machine, on the path of every cold `omnigent run -p`
(the runner's model client, before its hello; the REPL's API client) and of
every SDK client. A client whose base URL is `http://` (the local server, a
local model server) never uses that context, unless a redirect takes it to
`https://`. So it gets a context that trusts no CA at all: built in ~2 ms,
shared, and such a redirect fails verification instead of going unchecked.
Any other base URL keeps httpx's default verification.
"""

from __future__ import annotations

import ssl

_TRUSTS_NOTHING: ssl.SSLContext | None = None


def plain_http(base_url: str | None) -> bool:
    return bool(base_url) and str(base_url).lower().startswith("http://")


def verify_for(base_url: str | None) -> ssl.SSLContext | bool:
    """httpx's `verify` for a client of `base_url`: True (the CA bundle) unless it is plain HTTP."""
    global _TRUSTS_NOTHING
    if not plain_http(base_url):
        return True
    if _TRUSTS_NOTHING is None:
        _TRUSTS_NOTHING = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, against no CA
    return _TRUSTS_NOTHING
