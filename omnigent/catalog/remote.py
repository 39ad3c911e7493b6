"""`omnigent sessions --server URL`: the same commands through a server's API (the SDK).

Each call is one short `trio.run` with its own client: the commands make
one or two calls, so nothing is kept open between them. A 404 is the
unknown-session line; any other SDK error is its own one-line message.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from .backend import CatalogError, UnknownSession, public_row

if TYPE_CHECKING:
    from ..client import OmnigentClient

_T = TypeVar("_T")
MAX_LIMIT = 1000  # the API's page bound: `--limit 0` (all) lists at most this many


class _Missing(CatalogError):
    """A 404 of a call that names more than the session (a fork's item)."""


class RemoteCatalog:
    def __init__(self, base_url: str, *, token: str | None = None) -> None:
        self.base_url = base_url
        self.token = token or None
        self.note: str | None = None

    def _call(self, fn: Callable[[OmnigentClient], Awaitable[_T]], session_id: str | None = None) -> _T:
        import trio

        from ..client import NotFoundError, OmnigentClient, OmnigentError

        async def main() -> _T:
            async with OmnigentClient(self.base_url, token=self.token) as client:
                return await fn(client)

        try:
            return trio.run(main)
        except NotFoundError as exc:
            if session_id is not None:
                raise UnknownSession(session_id) from None
            raise _Missing(str(exc)) from None
        except OmnigentError as exc:
            raise CatalogError(str(exc)) from None

    def list_sessions(self, *, agent: str | None, limit: int | None, query: str | None) -> list[dict[str, Any]]:
        async def fetch(client: OmnigentClient) -> list[Any]:
            extra = {"search_query": query} if query is not None else {}
            return await client.sessions.list(limit=min(limit or MAX_LIMIT, MAX_LIMIT), agent_name=agent,
                                              sort_by="updated_at", **extra)

        return [public_row(row.raw) for row in self._call(fetch)]

    def session(self, session_id: str) -> dict[str, Any]:
        async def fetch(client: OmnigentClient) -> Any:
            return await client.sessions.get(session_id)

        return public_row(self._call(fetch, session_id).raw)

    def items(self, session_id: str) -> list[dict[str, Any]]:
        async def fetch(client: OmnigentClient) -> list[dict[str, Any]]:
            return await client.sessions.all_items(session_id)

        return self._call(fetch, session_id)

    def rename(self, session_id: str, title: str) -> dict[str, Any]:
        async def patch(client: OmnigentClient) -> Any:
            return await client.sessions.rename(session_id, title)

        return public_row(self._call(patch, session_id).raw)

    def delete(self, session_id: str) -> None:
        async def delete(client: OmnigentClient) -> None:
            # the server cancels a running or queued turn through its dispatcher first
            await client.sessions.delete(session_id)

        self._call(delete, session_id)

    def fork(self, session_id: str, *, at: str | None, title: str | None) -> dict[str, Any]:
        async def fork(client: OmnigentClient) -> Any:
            return await client.sessions.fork(session_id, title=title, up_to_response_id=at)

        async def exists(client: OmnigentClient) -> Any:
            return await client.sessions.get(session_id)

        try:
            return public_row(self._call(fork).raw)
        except _Missing:
            self._call(exists, session_id)  # an unknown session says so; else the item was unknown
            if at is None:
                raise
            raise CatalogError(f"no response or item {at!r} in session {session_id!r} "
                               f"(`omnigent sessions show {session_id} --json` lists its item ids)") from None

    def close(self) -> None:
        pass
