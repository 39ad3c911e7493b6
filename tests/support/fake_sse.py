"""A scripted HTTP/1.1 SSE server on anyio, for SDK tests under trio and asyncio alike.

Each accepted connection takes the next step of a script: a callable that
gets the request (path, query, headers) and a writer, and may send events,
cut the connection mid-message, answer an error status, or stop listening
for a while (a "restart" on the same port). Requests are recorded.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
from anyio.abc import SocketStream


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]


class Conn:
    def __init__(self, stream: SocketStream) -> None:
        self.stream = stream

    async def head(self, status: int = 200, content_type: str = "text/event-stream") -> None:
        await self.stream.send(f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\n"
                               f"Connection: close\r\n\r\n".encode())

    async def event(self, data: dict[str, Any], *, with_id: bool = False) -> None:
        lines = f"event: {data.get('type', 'x')}\n"
        if with_id and "sequence_number" in data:
            lines += f"id: {data['sequence_number']}\n"
        await self.stream.send((lines + f"data: {json.dumps(data)}\n\n").encode())

    async def raw(self, text: str) -> None:
        await self.stream.send(text.encode())

    async def error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        await self.stream.send(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                               f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)


Step = Callable[[Request, Conn], Awaitable[None]]


@dataclass
class FakeServer:
    port: int
    script: list[Step]
    requests: list[Request] = field(default_factory=list)
    pause_after: dict[int, float] = field(default_factory=dict)  # step index -> seconds not listening

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve the script one connection at a time; after the last step, keep listening idle."""
        step, first = 0, True
        while True:
            listener = (await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=self.port)).listeners[0]
            self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
            if first:
                task_status.started(self)
                first = False
            async with listener:
                while step < len(self.script):
                    stream = await listener.accept()
                    index, step = step, step + 1
                    await self._serve(stream, self.script[index])
                    if index in self.pause_after:
                        break
                else:
                    await anyio.sleep_forever()
            await anyio.sleep(self.pause_after[index])  # nobody listens: connections are refused

    async def _serve(self, stream: SocketStream, step: Step) -> None:
        async with stream:
            raw = b""
            while b"\r\n\r\n" not in raw:
                raw += await stream.receive()
            head = raw.split(b"\r\n\r\n", 1)[0].decode()
            request_line, *header_lines = head.split("\r\n")
            method, target, _ = request_line.split(" ", 2)
            parts = urlsplit(target)
            query = {k: v[0] for k, v in parse_qs(parts.query).items()}
            headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in header_lines)}
            req = Request(method, parts.path, query, headers)
            self.requests.append(req)
            try:
                await step(req, Conn(stream))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionError):
                pass  # the client hung up mid-step (it may, e.g. after a greeting it rejects)
