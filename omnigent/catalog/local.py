"""`omnigent sessions` on the store file itself: no server, no runner, no trio.

Opens `$OMNIGENT_DATA_DIR/chat.db` (`store.default_db_path`) like every
omnigent process does (WAL, migrations applied), so it can run next to a
live `omnigent run` or server on the same file. A store that does not exist
is not created: it lists nothing and knows no session. A store that cannot
be opened (newer schema, corrupt) is the store's own one-line error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .backend import CatalogError, UnknownSession, public_row

if TYPE_CHECKING:
    from ..store import Store


class LocalCatalog:
    def __init__(self, path: Any = None) -> None:
        from ..store import default_db_path

        self.path = default_db_path() if path is None else path
        self.note: str | None = None
        self._store: Store | None = None

    def _open(self) -> Store | None:
        """The store, or None when there is none yet (nothing is created)."""
        if self._store is None:
            from ..store import Store, StoreError

            if not self.path.exists():
                return None
            try:
                self._store = Store(self.path)
            except StoreError as exc:
                raise CatalogError(str(exc)) from None
        return self._store

    def _require(self, session_id: str) -> Store:
        store = self._open()
        if store is None or store.get_conversation(session_id) is None:
            raise UnknownSession(session_id)
        return store

    def list_sessions(self, *, agent: str | None, limit: int | None, query: str | None) -> list[dict[str, Any]]:
        store = self._open()
        if store is None:
            return []
        if query is None:
            rows = store.list_conversations(agent_name=agent, limit=limit, sort_by="updated_at")
        else:
            try:
                rows = store.search_conversations(query, agent_name=agent, limit=limit or 1_000_000)
            except ValueError as exc:  # nothing left to search for (an empty query, say)
                raise CatalogError(f"-q: {exc}") from None
            if store.search_mode == "like":
                self.note = store.search_note
        return [public_row(r) for r in rows]

    def session(self, session_id: str) -> dict[str, Any]:
        store = self._require(session_id)
        return public_row(store.get_conversation(session_id) or {})

    def items(self, session_id: str) -> list[dict[str, Any]]:
        return self._require(session_id).list_items(session_id)

    def rename(self, session_id: str, title: str) -> dict[str, Any]:
        return public_row(self._require(session_id).rename_conversation(session_id, title))

    def delete(self, session_id: str) -> None:
        from ..store import NotFoundError

        store = self._require(session_id)
        pid = _live_turn_owner(store, session_id)
        if pid is not None:
            # Deleting under that process would fail its turn mid-flight; its dispatcher cannot be
            # called from here, so the turn is asked to cancel through the store (the process sees
            # the request at its next claim renewal, every 2 s) and the rows go once it has.
            store.request_cancel(session_id)
            pid = _wait_for_turns_to_end(store, session_id, CANCEL_WAIT)
        if pid is not None:
            raise CatalogError(f"session {session_id} has a turn in progress in omnigent process {pid} that "
                               f"did not stop within {CANCEL_WAIT:.0f} s: stop it there (Ctrl-C), then rm again "
                               f"(if that process is `omnigent server`, `rm --server URL` cancels it through it)")
        try:  # a turn left running or queued by a process that is gone is marked cancelled first, by the store
            store.delete_conversation(session_id)
        except NotFoundError:  # removed by someone else meanwhile
            raise UnknownSession(session_id) from None

    def fork(self, session_id: str, *, at: str | None, title: str | None) -> dict[str, Any]:
        from ..store import NotFoundError

        store = self._require(session_id)
        try:
            return public_row(store.fork_conversation(session_id, title=title, up_to_response_id=at))
        except NotFoundError:
            if store.get_conversation(session_id) is None:
                raise UnknownSession(session_id) from None
            raise CatalogError(f"no response or item {at!r} in session {session_id!r} "
                               f"(`omnigent sessions show {session_id} --json` lists its item ids)") from None

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


_OPEN = ("queued", "running", "waiting")
CANCEL_WAIT = 10.0  # s: a claim renewal (2 s) plus the runner's cancel, with room for a loaded machine


def _wait_for_turns_to_end(store: Store, session_id: str, timeout: float) -> int | None:
    """Poll until no live process runs a turn of this session: None then, else that process's pid.

    A plain sleep loop: this is a short-lived CLI command, with no event loop to wait on.
    """
    import time

    deadline = time.monotonic() + timeout
    while (pid := _live_turn_owner(store, session_id)) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    return pid


def _live_turn_owner(store: Store, session_id: str) -> int | None:
    """The pid of another live omnigent process that runs (or will run) a turn of this session."""
    import os

    from ..store.owners import owner_alive

    claim = store.claim_of(session_id)
    if claim is not None and claim["live"] and claim["owner_pid"] != os.getpid():
        return int(claim["owner_pid"])
    for turn in store.list_turns(session_id):
        pid = turn.get("owner_pid")
        if turn["status"] in _OPEN and pid and pid != os.getpid() and owner_alive(int(pid), ""):
            return int(pid)
    return None
