"""The store: every table of omnigent's SQLite file behind one `Store` object.

The server is its only writer inside a process; other omnigent processes may
write the same file. It is synchronous on purpose: each call is well under a
millisecond (WAL + synchronous=NORMAL), so trio tasks call it directly.
Every method returns plain dicts with JSON columns decoded, so nothing above
the store sees sqlite rows. One Store belongs to one thread.

Each concern owns its SQL in a module of its own, as a mixin over the
shared helpers of `_base.Tables`; `Store` only opens the file and puts them
together. A new table (events, hosts, ...) is a new module and one more
base here, so callers keep calling `store.<method>`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ._base import (
    ANY,
    CONVERSATION_FIELDS,
    ITEM_STATUSES,
    KIND_DEFAULT,
    KIND_SUB_AGENT,
    TURN_STATUSES,
    derive_title,
)
from .agents import AgentsMixin
from .approvals import ApprovalsMixin
from .catalog import CatalogMixin
from .claims import ClaimsMixin
from .conversations import ConversationsMixin
from .db import open_database
from .events import EventsMixin
from .errors import ConflictError, NotFoundError, StoreError
from .files import FilesMixin
from .hosts import HostsMixin
from .items import ItemsMixin
from .runner_credentials import RunnerCredentialsMixin
from .steps import StepsMixin
from .turns import TurnsMixin


class Store(
    EventsMixin,  # first: its _write lets writes join an event transaction
    AgentsMixin,
    ConversationsMixin,
    ItemsMixin,
    TurnsMixin,
    FilesMixin,
    RunnerCredentialsMixin,
    ClaimsMixin,
    HostsMixin,
    StepsMixin,
    ApprovalsMixin,
    CatalogMixin,
):
    """All persistent state of an omnigent server, in one SQLite file.

    `Store(path)` opens (creating the file and its directory if needed) and
    migrates; use it as a context manager or call `close()`.
    """

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = path if str(path) == ":memory:" else Path(path).expanduser()
        self._clock = clock
        self.db = open_database(self.path, clock=clock)
        self.conn = self.db.conn

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "ANY",
    "CONVERSATION_FIELDS",
    "ITEM_STATUSES",
    "KIND_DEFAULT",
    "KIND_SUB_AGENT",
    "TURN_STATUSES",
    "ConflictError",
    "NotFoundError",
    "Store",
    "StoreError",
    "derive_title",
]
