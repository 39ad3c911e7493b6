"""The `hosts` table: registered host daemons, their credential and generation.

A host registers once (`POST /v1/hosts`) and gets an id and a secret; only
the secret's sha256 is kept, so a copy of the store opens no host link. A
revoked host is kept (so its id is refused knowingly) but never listed.
Every link the server accepts for a host bumps its `generation`, so frames
of an older link of the same host can be told apart. `conversations.host_id`
records the host a session belongs to.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence

from ._base import Row, Tables

HOST_PREFIX = "host_"
_COLUMNS = "id, name, secret_hash, workspace_roots, capacity, generation, created_at, last_seen_at, revoked_at"


def new_host_id() -> str:
    return f"{HOST_PREFIX}{secrets.token_hex(16)}"


class HostsMixin(Tables):
    def create_host(self, secret_hash: str, *, name: str = "", workspace_roots: Sequence[str] = (),
                    capacity: int = 0) -> dict:
        host_id = new_host_id()
        with self._write():
            self.db.execute(
                "INSERT INTO hosts (id, name, secret_hash, workspace_roots, capacity, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [host_id, name, secret_hash, json.dumps(list(workspace_roots)), capacity, self._clock()],
            )
        return self.get_host(host_id)  # type: ignore[return-value]

    def get_host(self, host_id: str) -> dict | None:
        """The host row (revoked ones too: `revoked_at` is set), roots decoded."""
        return _host(self._one(f"SELECT {_COLUMNS} FROM hosts WHERE id = ?", [host_id]))

    def list_hosts(self) -> list[dict]:
        """Hosts not revoked, oldest first."""
        return [_host(r) for r in self._all(
            f"SELECT {_COLUMNS} FROM hosts WHERE revoked_at IS NULL ORDER BY created_at, id")]

    def revoke_host(self, host_id: str) -> bool:
        """Its secret opens nothing any more; False when unknown or already revoked."""
        with self._write():
            return self.db.execute("UPDATE hosts SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                                   [self._clock(), host_id]).rowcount == 1

    def revoke_host_runner_credentials(self, host_id: str) -> int:
        """The secrets of every runner this host launched open nothing any more; returns how many."""
        with self._write():
            return self.db.execute("UPDATE runner_credentials SET revoked_at = ? WHERE host_id = ?"
                                   " AND revoked_at IS NULL", [self._clock(), host_id]).rowcount

    def accept_host_link(self, host_id: str, *, workspace_roots: list[str] | None = None,
                         capacity: int | None = None) -> int:
        """A link of this host was accepted: bump and return its generation, note what it declared."""
        with self._write():
            self.db.execute(
                "UPDATE hosts SET generation = generation + 1, last_seen_at = ?,"
                " workspace_roots = COALESCE(?, workspace_roots), capacity = COALESCE(?, capacity)"
                " WHERE id = ?",
                [self._clock(), None if workspace_roots is None else json.dumps(list(workspace_roots)),
                 capacity, host_id])
            return int(self._scalar("SELECT generation FROM hosts WHERE id = ?", [host_id]) or 0)

    def touch_host(self, host_id: str) -> None:
        """The host was heard from just now."""
        with self._write():
            self.db.execute("UPDATE hosts SET last_seen_at = ? WHERE id = ?", [self._clock(), host_id])

    def runner_host(self, runner_id: str) -> tuple[bool, str | None]:
        """(whether a credential of this runner id is stored, the host that sent it)."""
        row = self._one("SELECT host_id FROM runner_credentials WHERE runner_id = ?", [runner_id])
        return (row is not None, row["host_id"] if row else None)

    def conversation_host(self, conv_id: str) -> str | None:
        return self._scalar("SELECT host_id FROM conversations WHERE id = ?", [conv_id])

    def set_conversation_host(self, conv_id: str, host_id: str | None, *, workspace: str | None = None) -> None:
        """Record the host a session belongs to (and its workspace on that host, when given)."""
        self._require_conversation(conv_id)
        with self._write():
            if workspace is None:
                self.db.execute("UPDATE conversations SET host_id = ? WHERE id = ?", [host_id, conv_id])
            else:
                self.db.execute("UPDATE conversations SET host_id = ?, workspace = ? WHERE id = ?",
                                [host_id, workspace, conv_id])


def _host(row: Row) -> Row:
    if row is not None:
        try:
            roots = json.loads(row["workspace_roots"] or "[]")
        except ValueError:
            roots = []
        row["workspace_roots"] = roots if isinstance(roots, list) else []
    return row
