"""Exceptions raised by the store.

Callers (the server, the CLI) catch these to turn a storage problem into one
clear line for the user or an HTTP status, instead of a sqlite3 traceback.
"""

from __future__ import annotations


class StoreError(Exception):
    """The store cannot do what was asked; the message is one line for humans."""


class NotFoundError(StoreError, LookupError):
    """A row the call depends on (conversation, turn, cursor, ...) does not exist."""


class ConflictError(StoreError):
    """The call clashes with the current state (duplicate id, finished turn, ...)."""
