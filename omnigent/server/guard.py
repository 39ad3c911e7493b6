"""Which browser origins and Host names the server answers: the CSRF and DNS-rebinding guard.

A web page, even one on another local port, must not drive the server.
Browsers always send `Origin` on cross-origin requests (simple ones, such
as a `text/plain` POST or a multipart upload, included) and on every
websocket upgrade, so an Origin is accepted only when it is:

- absent (not a browser: curl, the SDK without its sentinel, a runner);
- this server's own origin: `http`, a loopback host and the port it listens on;
- `omnigent://internal`, the SDK's sentinel, which no browser can send.

`null` (sandboxed frames, `file:` pages) and every other origin are refused.

The Host check stops DNS rebinding (a page on `evil.example` whose name is
re-pointed at 127.0.0.1 is then same-origin, but its Host header is still
`evil.example`). Accepted: loopback names and addresses when loopback is
served, the address it is bound to (any IP literal on a wildcard bind: a
rebinding page always has a name), the machine's own host name when it
serves more than loopback, and the names given with `--allow-host` (a proxy
or DNS name in front of the server). The port is not compared: a
proxy may serve another one.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from .sockets import LOOPBACK

INTERNAL_ORIGIN = "omnigent://internal"
_WILDCARDS = frozenset({"0.0.0.0", "::", ""})


@dataclass(frozen=True)
class Guard:
    port: int = 0                     # the port this server listens on
    bind_host: str = "127.0.0.1"      # the address it was told to serve
    allow_hosts: frozenset[str] = field(default_factory=frozenset)

    def origin_refusal(self, origin: str | None) -> str | None:
        """Why a request with this Origin header is refused, None when it is accepted."""
        if origin is None or origin == INTERNAL_ORIGIN:
            return None
        try:
            parts = urlsplit(origin)
            port = parts.port
        except ValueError:
            return f"requests from origin {origin[:100]!r} are refused"
        if (parts.scheme == "http" and parts.hostname is not None and _is_loopback(parts.hostname)
                and port == self.port and not parts.path and not parts.query and parts.username is None):
            return None
        return f"requests from origin {origin[:100]!r} are refused"

    def host_refusal(self, host_header: str | None) -> str | None:
        """Why a request with this Host header is refused, None when it is accepted."""
        host = _host_name(host_header or "")
        if host is None:
            return f"host {(host_header or '')[:100]!r} is refused"
        if host in self.allow_hosts:
            return None
        wildcard = self.bind_host in _WILDCARDS
        if _is_loopback(host) and (wildcard or _is_loopback(self.bind_host)):
            return None  # loopback is served, and a rebinding page never has a loopback Host
        if not _is_loopback(self.bind_host) and host == socket.gethostname().lower():
            return None
        address = _ip_or_none(host)
        if address is None:
            return f"host {host[:100]!r} is refused (start the server with --allow-host {host[:100]} to accept it)"
        if wildcard or address == _ip_or_none(self.bind_host):
            return None
        return f"host {host[:100]!r} is not an address this server serves"


def _is_loopback(host: str) -> bool:
    if host in LOOPBACK:
        return True
    address = _ip_or_none(host)
    return address is not None and address.is_loopback


def _ip_or_none(host: str):
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _host_name(header: str) -> str | None:
    """The lower-cased name of a Host header without its port (IPv6 literals without brackets)."""
    header = header.strip().lower()
    if not header:
        return None
    if header.startswith("["):
        end = header.find("]")
        rest = header[end + 1:]
        if end < 0 or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return header[1:end]
    name, _, port = header.partition(":")
    if port and not port.isdigit():
        return None
    return name or None
