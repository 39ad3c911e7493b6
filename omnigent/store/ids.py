"""Identifier format shared by every row the store writes.

Ids are `<prefix>_<32 hex>` (uuid4) so they are TEXT, sortable by nothing,
recognisable by kind, and compatible with what the original omnigent's
clients and S1's raw SQL expect (`conv_...`).
"""

from __future__ import annotations

import re
import uuid

CONVERSATION = "conv"
AGENT = "ag"
TURN = "turn"
MESSAGE = "msg"
RESPONSE = "resp"
RUNNER = "runner"
FILE = "file"
APPROVAL = "appr"
RULE = "rule"

PREFIXES = frozenset({CONVERSATION, AGENT, TURN, MESSAGE, RESPONSE, RUNNER, FILE, APPROVAL, RULE})

_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]*$")


def new_id(prefix: str) -> str:
    """A fresh `<prefix>_<uuid4 hex>` id."""
    if not _PREFIX_RE.match(prefix):
        raise ValueError(f"invalid id prefix {prefix!r}")
    return f"{prefix}_{uuid.uuid4().hex}"


def is_id(value: object, prefix: str) -> bool:
    """True if `value` looks like an id made by `new_id(prefix)`."""
    return isinstance(value, str) and re.fullmatch(rf"{re.escape(prefix)}_[0-9a-f]{{32}}", value) is not None
