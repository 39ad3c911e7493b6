"""Where `omnigent sessions` acts: one interface over the local store and a server's API.

Both backends return the same plain dicts (`public_row`), so every command
prints the same thing whichever it talks to. Failures are `CatalogError`s,
one line for the user; `UnknownSession` names the command that lists ids.
"""

from __future__ import annotations

from typing import Any, Protocol

LIST_HINT = "omnigent sessions list"
# what a listed or shown session says about itself, for both backends (and --json)
PUBLIC_FIELDS = ("id", "title", "agent_name", "created_at", "updated_at", "message_count", "item_count",
                 "forked_from", "workspace")


class CatalogError(Exception):
    """What `omnigent sessions` prints as `Error: <message>` (exit 1)."""


class UnknownSession(CatalogError):
    def __init__(self, session_id: str) -> None:
        super().__init__(f"no session {session_id!r} (`{LIST_HINT}` shows the ids)")
        self.session_id = session_id


class Catalog(Protocol):
    """What the commands need; `note` is a line to say once (e.g. search without FTS5)."""

    note: str | None

    def list_sessions(self, *, agent: str | None, limit: int | None, query: str | None) -> list[dict[str, Any]]: ...

    def session(self, session_id: str) -> dict[str, Any]: ...

    def items(self, session_id: str) -> list[dict[str, Any]]: ...

    def rename(self, session_id: str, title: str) -> dict[str, Any]: ...

    def delete(self, session_id: str) -> None: ...

    def fork(self, session_id: str, *, at: str | None, title: str | None) -> dict[str, Any]: ...

    def close(self) -> None: ...


def public_row(row: dict[str, Any]) -> dict[str, Any]:
    """The fields of `PUBLIC_FIELDS` (None when the source lacks one), plus `snippet` of a search."""
    out = {name: row.get(name) for name in PUBLIC_FIELDS}
    out["title"] = out["title"] or ""
    for count in ("message_count", "item_count"):
        out[count] = out[count] or 0
    if "snippet" in row:
        out["snippet"] = row.get("snippet") or ""
    return out


def check_server_url(url: str) -> str:
    """An http(s) URL with a host, without its trailing slash (as `run --server` takes it)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CatalogError(f"--server: expected an http(s)://HOST[:PORT] URL, not {url!r}")
    return url.strip().rstrip("/")
