"""The `runner_credentials` table: which secret hash opens which runner id.

Only a hash of each runner's secret is kept (the secret lives in the
runner's environment), so a copy of the store opens no runner route. A
runner id is bound once: a second registration of the same id changes
nothing. Revoked rows are kept for a while so a late reconnect is refused
knowingly, then pruned.
"""

from __future__ import annotations

from ._base import Tables


class RunnerCredentialsMixin(Tables):
    def add_runner_credential(self, runner_id: str, secret_hash: str, *, kind: str,
                              host_id: str | None = None) -> bool:
        """Bind a secret hash to a new runner id; False (nothing changed) if the id is known."""
        if kind not in ("host", "explicit"):
            raise ValueError(f"credential kind must be 'host' or 'explicit', not {kind!r}")
        with self._write():
            return self.db.execute(
                "INSERT OR IGNORE INTO runner_credentials (runner_id, secret_hash, kind, host_id, created_at)"
                " VALUES (?, ?, ?, ?, ?)", [runner_id, secret_hash, kind, host_id, self._clock()],
            ).rowcount == 1

    def runner_credential(self, runner_id: str) -> dict | None:
        """The credential row of a runner id (revoked ones too: `revoked_at` is set)."""
        return self._one("SELECT runner_id, secret_hash, kind, host_id, created_at, revoked_at"
                         " FROM runner_credentials WHERE runner_id = ?", [runner_id])

    def revoke_runner_credential(self, runner_id: str) -> None:
        """That runner process is gone: its secret opens nothing any more."""
        with self._write():
            self.db.execute("UPDATE runner_credentials SET revoked_at = ? WHERE runner_id = ?"
                            " AND revoked_at IS NULL", [self._clock(), runner_id])

    def prune_runner_credentials(self, older_than: float) -> int:
        """Forget credentials revoked more than `older_than` seconds ago; returns how many."""
        with self._write():
            return self.db.execute("DELETE FROM runner_credentials WHERE revoked_at < ?",
                                   [self._clock() - older_than]).rowcount
