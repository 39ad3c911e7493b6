"""A burst of connections waits in the accept queue while the server's loop is busy.

When the queue is full the kernel drops new SYNs, and each such client waits
out a SYN retransmit (1 s, then 2 s, ...): with hypercorn's default backlog
of 100, the 100 sessions of `scripts/bench_sessions.py` opening their streams
overflowed it ~100 times a run. Here the test holds the server's loop (it
does not yield) while 300 clients connect: every handshake must complete.
The mock model server (`omnigent.testing.mock_llm`) is held to the same.
"""

from __future__ import annotations

import select
import socket
import time

import pytest

from omnigent.server.serve import run_server
from omnigent.server.sockets import bind_socket
from omnigent.store import Store
from omnigent.testing import mock_llm

BURST = 300  # three times hypercorn's default backlog (100)


def _somaxconn() -> int:
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            return int(f.read())
    except (OSError, ValueError):
        return socket.SOMAXCONN


_BURSTS_FIT = pytest.mark.skipif(_somaxconn() < BURST, reason="the kernel caps every accept queue below "
                                                                 "the burst (net.core.somaxconn)")


def _burst_completes(url: str) -> None:
    """Open BURST connections to `url` without yielding to trio: every handshake within 0.9 s."""
    name, port = url.split("//", 1)[1].rsplit(":", 1)
    clients: list[socket.socket] = []
    try:
        # no checkpoint from here to the poll: the server accepts nothing meanwhile
        poller = select.poll()
        for _ in range(BURST):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex((name, int(port)))
            clients.append(sock)
            poller.register(sock, select.POLLOUT)
        connected: set[int] = set()
        deadline = time.monotonic() + 0.9  # under the first SYN retransmit (1 s)
        while len(connected) < BURST and time.monotonic() < deadline:
            for fd, _ in poller.poll(100):
                connected.add(fd)
                poller.unregister(fd)
        assert len(connected) == BURST
        assert all(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 for s in clients)
    finally:
        for sock in clients:
            sock.close()


@_BURSTS_FIT
async def test_a_burst_of_connections_completes_its_handshakes_while_the_loop_is_busy(nursery, tmp_path):
    store = Store(tmp_path / "chat.db")
    handle = await nursery.start(lambda task_status: run_server(
        store, bind_socket(), token=None, task_status=task_status))
    try:
        _burst_completes(handle.url)
    finally:
        await handle.aclose()
        store.close()


@_BURSTS_FIT
async def test_the_mock_model_server_takes_the_same_burst(nursery):
    url = await nursery.start(mock_llm.serve)  # (the fixture's nursery stops it)
    _burst_completes(url)
