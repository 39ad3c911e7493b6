"""Bare ASGI pieces that the routes served in front of quart share (`front.py`, `runner_socket.py`).

A request's headers read by name as werkzeug reads them, and a JSON answer
encoded byte for byte as quart encodes one, so a client cannot tell which
of the two answered.
"""

from __future__ import annotations

import json
from typing import Any


class Headers:
    """A request's headers by lower-cased name, the first of a repeated one (as werkzeug's `get`)."""

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self._by_name: dict[str, str] = {}
        for name, value in raw:
            self._by_name.setdefault(name.decode("latin1").lower(), value.decode("latin1"))

    def get(self, name: str) -> str | None:
        return self._by_name.get(name.lower())


def json_answer(answer: dict[str, Any], *, close: bool = False) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """(headers, body) of a JSON answer as quart writes it: sorted keys, compact, ASCII, a newline."""
    data = (json.dumps(answer, sort_keys=True, separators=(",", ":")) + "\n").encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    return headers, data
