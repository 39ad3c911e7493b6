"""Server-sent events: lines in, (event, data, id) messages out.

The subset of the WHATWG rules that matters here: `event:`, `data:` (several
lines are joined with newlines), `id:`, comments (`:`), and a blank line that
ends a message. `data: [DONE]` with no `event:` line is the server's
end-of-stream sentinel; it comes out as a message whose data is "[DONE]".
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass

DONE = "[DONE]"


@dataclass(frozen=True)
class ServerSentEvent:
    event: str | None
    data: str
    id: str | None


async def iter_sse(lines: AsyncIterable[str]) -> AsyncIterator[ServerSentEvent]:
    event: str | None = None
    data: list[str] = []
    last_id: str | None = None
    async for line in lines:
        line = line.rstrip("\r\n")
        if not line:
            if data:
                yield ServerSentEvent(event, "\n".join(data), last_id)
            event, data = None, []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id" and "\0" not in value:
            last_id = value
    # a message cut off by the end of the body is dropped (it may be half a JSON object);
    # a reconnecting reader asks for it again by sequence number
