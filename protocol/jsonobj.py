"""A peer's text parsed into one JSON object, or one ProtocolError saying why not."""

from __future__ import annotations

import json
from typing import Any

from .errors import ProtocolError


def load_object(raw: str | bytes, what: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"{what} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError(f"{what} is not a JSON object")
    return data
