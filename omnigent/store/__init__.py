"""Persistence for omnigent: one SQLite file shared by every process that needs it.

Re-exports the public API so callers write `from omnigent.store import Store`.
Synchronous and free of trio and server imports: the server calls it
straight from trio tasks (each call is well under a millisecond).
"""

from .db import migrate
from .errors import ConflictError, NotFoundError, StoreError
from .ids import is_id, new_id
from .migrations import MIGRATIONS
from .paths import default_data_dir, default_db_path
from .store import (
    ANY,
    CONVERSATION_FIELDS,
    ITEM_STATUSES,
    KIND_DEFAULT,
    KIND_SUB_AGENT,
    TURN_STATUSES,
    Store,
    derive_title,
)

__all__ = [
    "ANY",
    "CONVERSATION_FIELDS",
    "ITEM_STATUSES",
    "KIND_DEFAULT",
    "KIND_SUB_AGENT",
    "MIGRATIONS",
    "TURN_STATUSES",
    "ConflictError",
    "NotFoundError",
    "Store",
    "StoreError",
    "default_data_dir",
    "default_db_path",
    "derive_title",
    "is_id",
    "migrate",
    "new_id",
]
