"""The SDK's client lets an idle connection go before the server does, and keeps it past a pause.

hypercorn and httpx both held an idle connection 5 s: each prompt after a person's pause paid a
new connection (and a TLS handshake to a remote server), and a client could send its request on
a connection the server was just closing. The server's side is tested on real sockets in
tests/integration/test_connections.py.
"""

from __future__ import annotations

from omnigent.client._http import KEEPALIVE_EXPIRY, Transport
from omnigent.server import connections


def test_the_client_lets_an_idle_connection_go_before_the_server_closes_it() -> None:
    config = connections.Config()
    assert config.keep_alive_timeout == connections.KEEP_ALIVE
    assert 30 <= KEEPALIVE_EXPIRY < config.keep_alive_timeout
    assert config.first_request_timeout == connections.FIRST_REQUEST < KEEPALIVE_EXPIRY


def test_the_sdks_pool_keeps_httpxs_limits_but_for_the_expiry() -> None:
    pool = Transport("http://127.0.0.1:9", headers=None, auth=None, timeout=5).http._transport._pool
    assert pool._keepalive_expiry == KEEPALIVE_EXPIRY
    assert (pool._max_connections, pool._max_keepalive_connections) == (100, 20)
