"""A loopback TCP proxy on anyio that can cut every connection through it at once.

Tests put it between a client and a real server to drop streams mid-flight
while the server stays up, under trio or asyncio alike.
"""

from __future__ import annotations

from typing import Any

import anyio
from anyio.abc import SocketStream, TaskGroup


class Proxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.connections = 0
        self._scopes: list[anyio.CancelScope] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def drop_all(self) -> None:
        """Cut every open connection (the client sees a reset or EOF mid-stream)."""
        for scope in self._scopes:
            scope.cancel()
        self._scopes.clear()

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        listener = (await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)).listeners[0]
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with listener, anyio.create_task_group() as tg:
            task_status.started(self)
            while True:
                client = await listener.accept()
                tg.start_soon(self._serve, client)

    async def _serve(self, client: SocketStream) -> None:
        self.connections += 1
        with anyio.CancelScope() as scope:
            self._scopes.append(scope)
            async with client, await anyio.connect_tcp("127.0.0.1", self.upstream_port) as server:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_pump, client, server, tg)
                    tg.start_soon(_pump, server, client, tg)


async def _pump(src: SocketStream, dst: SocketStream, tg: TaskGroup) -> None:
    try:
        async for chunk in src:
            await dst.send(chunk)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass
    tg.cancel_scope.cancel()  # one side closed: close both
