"""The listening socket, bound before the server's heavy imports.

Kept apart from `serve` so binding costs no import of quart or the store: the
caller binds, launches the runner (which dials this port and waits in the
backlog), and only then starts the server on the same socket.
"""

from __future__ import annotations

import socket

# names and addresses of this machine only, as bound, in a URL or in a Host header
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})

# The accept queue. A burst of clients (100 sessions opening their streams at once, the
# runners of a restarted host) fills a short queue while the server's loop is busy: the
# kernel then drops new SYNs (or a handshake's last ACK), and each such client waits out a
# retransmit (1 s, then 2 s...). With 128 here and hypercorn's 100 (it listens again, see
# serve.py), bench_sessions' opening overflowed ~100 times a run. The kernel caps this at
# net.core.somaxconn.
BACKLOG = socket.SOMAXCONN


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"
