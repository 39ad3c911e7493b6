"""The `turns` table: one row per user message that asks for an answer, and its attempts.

Guarantees: a turn moves queued -> running -> one end state; an ended
turn is never restarted, and a stale report (an older attempt, a turn
already ended) never overwrites a newer outcome. Each turn records the
process that owns it, so turns left by a process that died are found
(`interrupt_orphaned_turns`) and each process runs only its own
(`next_own_queued_turn`). A restarted server takes over the turns of its dead
predecessor instead (`take_over_orphaned_turns`): the running ones wait for
their runner to reconnect and claim them, the queued ones run again. Each
attempt records the session's ownership generation it was dispatched under.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from typing import Any

from . import ids
from ._base import STEP_COLUMNS, TURN_OPEN, TURN_STATUSES, Tables, _step, _turn, in_chunks
from .errors import ConflictError, NotFoundError

_TURN_SELECT = """
    SELECT t.id, t.conversation_id, t.input_item_id, t.status, t.attempt,
           t.runner_id, t.owner_pid, t.error, t.created_at, t.started_at,
           t.ended_at, t.generation, o.turn_id IS NOT NULL AS output_persisted,
           t.usage, t.approval_timeout,
           (SELECT MAX(s.step) FROM turn_steps s WHERE s.turn_id = t.id) AS last_step
    FROM turns t LEFT JOIN turn_outputs o ON o.turn_id = t.id
"""
# The same row from the statement that wrote it (`_written`), where reading it back was a second
# statement with the same join: every message's turn and every attempt's start.
TURN_RETURNING = """
    RETURNING id, conversation_id, input_item_id, status, attempt, runner_id, owner_pid, error,
              created_at, started_at, ended_at, generation,
              EXISTS (SELECT 1 FROM turn_outputs o WHERE o.turn_id = turns.id) AS output_persisted,
              usage, approval_timeout,
              (SELECT MAX(s.step) FROM turn_steps s WHERE s.turn_id = turns.id) AS last_step
"""
_STEP_SELECT = f"SELECT {', '.join(STEP_COLUMNS)} FROM turn_steps"
_CHUNK = 400  # (turn, step) pairs per query: well under SQLite's limit of bound variables


class _Keep:
    """The type of `_KEEP`: leave the stored value as it is."""


_KEEP = _Keep()


class TurnsMixin(Tables):
    def _with_steps(self, rows: list[dict]) -> list[dict]:
        # each turn row gains `step`, its last step row (store/steps.py): where the turn is, or
        # where it stopped
        wanted = [(r["id"], r["last_step"]) for r in rows if r["last_step"] is not None]
        found: dict[str, dict] = {}
        for start in range(0, len(wanted), _CHUNK):
            chunk = wanted[start:start + _CHUNK]
            pairs = ", ".join("(?, ?)" for _ in chunk)
            for row in self._all(f"{_STEP_SELECT} WHERE (turn_id, step) IN (VALUES {pairs})",
                                 [v for pair in chunk for v in pair]):
                found[row["turn_id"]] = _step(row)  # type: ignore[assignment]
        return [_turn(r, found.get(r["id"])) for r in rows]  # type: ignore[misc]

    def _with_step(self, row: dict | None) -> dict | None:
        return self._with_steps([row])[0] if row is not None else None

    def create_turn(self, conv_id: str, input_item_id: str | None, *, owner_pid: int | None = None,
                    approval_timeout: float | None = None) -> dict:
        """A new 'queued' turn. `owner_pid` defaults to this process, so a queued
        turn of a process that died can be found by `interrupt_orphaned_turns`.
        `approval_timeout` as in `queue_message` (None: until answered)."""
        turn_id = ids.new_id(ids.TURN)
        with self._write():
            self._require_conversation(conv_id)
            return self._with_step(self._written(
                """INSERT INTO turns (id, conversation_id, input_item_id, status, owner_pid, created_at,
                                      approval_timeout)
                   VALUES (?, ?, ?, 'queued', ?, ?, ?)""" + TURN_RETURNING,
                [turn_id, conv_id, input_item_id, os.getpid() if owner_pid is None else owner_pid, self._clock(),
                 approval_timeout],
            ))  # type: ignore[return-value]

    def get_turn(self, turn_id: str) -> dict | None:
        return self._with_step(self._one(_TURN_SELECT + " WHERE t.id = ?", [turn_id]))

    def _require_turn(self, turn_id: str) -> str:
        status = self._scalar("SELECT status FROM turns WHERE id = ?", [turn_id])
        if status is None:
            raise NotFoundError(f"turn {turn_id!r} not found")
        return status

    def list_turns(self, conv_id: str, *, status: str | None = None) -> list[dict]:
        """Turns of a conversation, oldest first."""
        sql = _TURN_SELECT + " WHERE t.conversation_id = ?"
        params: list[Any] = [conv_id]
        if status is not None:
            sql += " AND t.status = ?"
            params.append(status)
        return self._with_steps(self._all(sql + " ORDER BY t.created_at, t.rowid", params))

    def request_cancel(self, conv_id: str) -> int:
        """Ask the process running this conversation's open turns to cancel them (`sessions rm`
        on the local store): it sees the request at its next claim renewal. Returns how many."""
        with self._write():
            return self.db.execute(
                "UPDATE turns SET cancel_requested_at = ? WHERE conversation_id = ?"
                " AND status IN ('queued', 'running', 'waiting') AND cancel_requested_at IS NULL",
                [self._clock(), conv_id]).rowcount

    def cancel_requested(self, turn_ids: Collection[str]) -> set[str]:
        """Those of these turns whose cancelling another process asked for (`request_cancel`)."""
        asked: set[str] = set()
        for chunk in in_chunks(turn_ids):
            marks = ", ".join("?" * len(chunk))
            asked.update(row[0] for row in self.conn.execute(
                f"SELECT id FROM turns WHERE id IN ({marks}) AND cancel_requested_at IS NOT NULL", chunk))
        return asked

    def next_queued_turn(self, conv_id: str) -> dict | None:
        """The oldest 'queued' turn of a conversation."""
        return self._with_step(
            self._one(
                _TURN_SELECT + " WHERE t.conversation_id = ? AND t.status = 'queued' ORDER BY t.created_at, t.rowid LIMIT 1",
                [conv_id],
            )
        )

    def next_own_queued_turn(self, conv_id: str, owner_pid: int) -> dict | None:
        """The oldest 'queued' turn of a conversation that the process `owner_pid` posted.

        Each process runs only its own turns: another live process's queued
        turn is its to run (and its client waits for it there).
        """
        return self._with_step(
            self._one(
                _TURN_SELECT + """ WHERE t.conversation_id = ? AND t.status = 'queued' AND t.owner_pid = ?
                                   ORDER BY t.created_at, t.rowid LIMIT 1""",
                [conv_id, owner_pid],
            )
        )

    def start_turn(self, turn_id: str, runner_id: str | None, owner_pid: int | None = None,
                   *, generation: int | None = None) -> dict:
        """Mark a queued, interrupted (or re-dispatched running) turn 'running'; attempt += 1.

        `generation` is the session's ownership generation this attempt is
        dispatched under. Raises ConflictError if the turn already ended.
        """
        with self._write_one():
            # one statement on the way every dispatch takes: the update, and the row as it left it
            # (TURN_OPEN is every status but the terminal ones)
            started = self._written(
                f"""UPDATE turns SET status = 'running', attempt = attempt + 1, runner_id = ?,
                       owner_pid = COALESCE(?, owner_pid), error = NULL, started_at = ?, ended_at = NULL,
                       generation = ?
                   WHERE id = ? AND status IN ({", ".join("?" * len(TURN_OPEN))})""" + TURN_RETURNING,
                [runner_id, owner_pid, self._clock(), generation, turn_id, *TURN_OPEN],
            )
            if started is None:
                raise ConflictError(f"turn {turn_id!r} is already {self._require_turn(turn_id)}")
        return self._with_step(started)  # type: ignore[return-value]

    def finish_turn(
        self, turn_id: str, status: str, error: str | None = None, *, attempt: int | None = None
    ) -> dict | None:
        """End a turn as completed, failed, interrupted or cancelled.

        Returns the updated turn, or None if it had already ended (or, with
        `attempt`, if that is no longer the current attempt): a stale report
        never overwrites a newer outcome.
        """
        if not self.end_turn(turn_id, status, error, attempt=attempt):
            return None
        return self.get_turn(turn_id)

    def end_turn(self, turn_id: str, status: str, error: str | None = None, *, attempt: int | None = None) -> bool:
        """`finish_turn` without reading the turn back: whether it ended it (for a caller that has what
        it needs of the row: the turn's end is one statement then)."""
        if status not in TURN_STATUSES - {"queued", "running", "waiting"}:
            raise ValueError(f"cannot finish a turn as {status!r}")
        with self._write_one():
            sql = f"""UPDATE turns SET status = ?, error = ?, ended_at = ?
                      WHERE id = ? AND status IN ({", ".join("?" * len(TURN_OPEN))})"""
            params: list[Any] = [status, error, self._clock(), turn_id, *TURN_OPEN]
            if attempt is not None:
                sql += " AND attempt = ?"
                params.append(attempt)
            if not self.db.execute(sql, params).rowcount:
                self._require_turn(turn_id)  # (only then: a missing turn is NotFoundError, an ended one False)
                return False
        return True

    def mark_interrupted(self, turn_id: str) -> dict | None:
        """queued/running -> 'interrupted'; None if the turn was in another state."""
        with self._write():
            self._require_turn(turn_id)
            changed = self.db.execute(
                "UPDATE turns SET status = 'interrupted', ended_at = ? WHERE id = ?"
                " AND status IN ('queued', 'running', 'waiting')",
                [self._clock(), turn_id],
            ).rowcount
        return self.get_turn(turn_id) if changed else None

    def interrupt_runner_turns(self, runner_id: str) -> list[dict]:
        """Every running turn of a lost runner -> 'interrupted'; returns them."""
        with self._write():
            turn_ids = [
                r[0]
                for r in self.conn.execute(
                    "SELECT id FROM turns WHERE runner_id = ? AND status = 'running'", [runner_id]
                )
            ]
            if turn_ids:
                self.db.execute(
                    "UPDATE turns SET status = 'interrupted', ended_at = ? WHERE runner_id = ? AND status = 'running'",
                    [self._clock(), runner_id],
                )
        return [self.get_turn(t) for t in turn_ids]  # type: ignore[misc]

    def interrupt_orphaned_turns(self, alive_pid_check: Callable[[int], bool]) -> list[dict]:
        """Queued or running turns whose owner process is gone -> 'interrupted'.

        The liveness check runs outside the write lock; the update re-checks
        status and owner so a turn taken over meanwhile is left alone.
        """
        candidates = self.conn.execute(
            "SELECT id, owner_pid FROM turns WHERE status IN ('queued', 'running', 'waiting') AND owner_pid IS NOT NULL"
        ).fetchall()
        alive: dict[int, bool] = {}
        dead = []
        for turn_id, pid in candidates:
            if pid not in alive:
                alive[pid] = bool(alive_pid_check(pid))
            if not alive[pid]:
                dead.append((turn_id, pid))
        changed = []
        if dead:
            with self._write():
                now = self._clock()
                for turn_id, pid in dead:
                    if self.db.execute(
                        """UPDATE turns SET status = 'interrupted', ended_at = ?
                           WHERE id = ? AND owner_pid = ? AND status IN ('queued', 'running', 'waiting')""",
                        [now, turn_id, pid],
                    ).rowcount:
                        changed.append(turn_id)
        return [self.get_turn(t) for t in changed]  # type: ignore[misc]

    def take_over_orphaned_turns(self, alive_pid_check: Callable[[int], bool], owner_pid: int) -> list[dict]:
        """Queued or running turns whose owner process is gone: now `owner_pid`'s, status kept.

        What a restarted server does instead of `interrupt_orphaned_turns`: a
        running turn may still be running on a runner that will reconnect and
        claim it, so it is not ended here. A live owner's turns are left alone
        (another `omnigent run` sharing the store runs them).
        """
        # an interrupted turn whose conversation claim (see store/claims.py) still names it was
        # waiting for its next attempt when its process died: it is queued again
        candidates = self.conn.execute(
            """SELECT t.id, t.owner_pid FROM turns t WHERE t.owner_pid IS NOT NULL AND (
                   t.status IN ('queued', 'running', 'waiting') OR (t.status = 'interrupted' AND EXISTS (
                       SELECT 1 FROM conversation_claims c WHERE c.conversation_id = t.conversation_id
                       AND c.turn_id = t.id)))"""
        ).fetchall()
        alive: dict[int, bool] = {}
        dead = []
        for turn_id, pid in candidates:
            if pid not in alive:
                alive[pid] = pid != owner_pid and bool(alive_pid_check(pid))
            if not alive[pid]:
                dead.append((turn_id, pid))
        taken = []
        if dead:
            with self._write():
                for turn_id, pid in dead:
                    if self.db.execute(
                        """UPDATE turns SET owner_pid = ?,
                               status = CASE status WHEN 'interrupted' THEN 'queued' ELSE status END
                           WHERE id = ? AND owner_pid = ?
                             AND status IN ('queued', 'running', 'waiting', 'interrupted')""",
                        [owner_pid, turn_id, pid],
                    ).rowcount:
                        taken.append(turn_id)
        return [self.get_turn(t) for t in taken]  # type: ignore[misc]

    def requeue_turn(self, turn_id: str, *, approval_timeout: float | None | _Keep = _KEEP) -> dict:
        """An interrupted (or failed or cancelled) turn back to 'queued': same id, its steps kept.

        What `/retry` does with a turn that has stored steps: the loop goes on
        from its first unfinished step instead of starting the turn afresh
        (which would run its tools again). The turn is this process's now.
        Raises ConflictError for a turn that is still under way or completed.
        `approval_timeout`, when given, replaces the turn's (whoever retries may
        be at a terminal where the first post was not, or the other way round).
        """
        with self._write():
            status = self._require_turn(turn_id)
            if status not in ("interrupted", "failed", "cancelled"):
                raise ConflictError(f"turn {turn_id!r} is {status}: only an interrupted, failed or cancelled "
                                    "turn can be retried")
            self.db.execute(
                "UPDATE turns SET status = 'queued', error = NULL, ended_at = NULL, owner_pid = ? WHERE id = ?",
                [os.getpid(), turn_id])
            if not isinstance(approval_timeout, _Keep):
                self.db.execute("UPDATE turns SET approval_timeout = ? WHERE id = ?", [approval_timeout, turn_id])
        return self.get_turn(turn_id)  # type: ignore[return-value]

    def running_own_turn(self, conv_id: str, owner_pid: int) -> dict | None:
        """The conversation's 'running' (or 'waiting': for an approval) turn owned by `owner_pid`
        (one taken over after a restart)."""
        # `+t.created_at`: ordered by (conversation_id, created_at), SQLite would walk every turn
        # of the conversation to spare a sort; by status it reads the open ones and sorts those few
        return self._with_step(self._one(
            _TURN_SELECT + """ WHERE t.conversation_id = ? AND t.status IN ('running', 'waiting') AND t.owner_pid = ?
                               ORDER BY +t.created_at, t.rowid LIMIT 1""", [conv_id, owner_pid]))
