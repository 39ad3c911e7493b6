"""One turn at a time per conversation, across processes: conversation claims and pending items.

A claim (`conversation_claims`) names the live process, and the turn
service in it, that runs the conversation's turns now, with a lease. It is
taken over only when its holder is dead (pid gone or reused) or let the
lease run out. A message that arrives while the conversation is busy
waits in `pending_items` and joins the conversation when its turn holds
the claim, so it comes after the answer it waited for.

Needs `ItemsMixin` (for `_insert_items`) in the same `Store`; a queued turn's
row is `TurnsMixin`'s (`TURN_RETURNING`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from . import ids
from ._base import Tables, _turn, _wire_item, in_chunks
from .errors import NotFoundError
from .items import HEAD_COLUMNS
from .owners import ClaimOwner, owner_alive
from .turns import TURN_RETURNING


class ClaimsMixin(Tables):
    if TYPE_CHECKING:  # ItemsMixin's, beside this one in `Store`
        def _insert_items(self, conv_id: str, items: list[dict], *, turn_id: str | None,
                          response_id: str | None, status: str | None, output_indexed: bool,
                          first_index: int = 0, head: tuple[Any, ...] | None = None) -> list[dict]: ...

    def claim_conversation(self, conv_id: str, owner: ClaimOwner, *, turn_id: str | None, lease: float) -> bool:
        """Take (or renew) the conversation's claim for `owner`, for `lease` seconds.

        Succeeds when the conversation is unclaimed, already `owner`'s, or its
        holder is dead (pid gone or reused) or let its lease expire.
        """
        with self._write():
            self._require_conversation(conv_id)
            now = self._clock()
            row = self.conn.execute(
                "SELECT owner_pid, owner_started, owner_token, lease_until FROM conversation_claims"
                " WHERE conversation_id = ?", [conv_id]).fetchone()
            if row is not None and not _same_owner(row, owner) and row[3] > now and owner_alive(row[0], row[1]):
                return False
            self.db.execute(
                """INSERT OR REPLACE INTO conversation_claims (conversation_id, turn_id, owner_pid,
                       owner_started, owner_token, lease_until, claimed_at) VALUES (?, ?, ?, ?, ?, ?, ?)""",
                [conv_id, turn_id, owner.pid, owner.started, owner.token, now + lease, now],
            )
        return True

    def renew_claims(self, conv_ids: Collection[str], owner: ClaimOwner, *, lease: float) -> set[str]:
        """Extend `owner`'s claims on these conversations, in one transaction whatever their number
        (one statement per `IN_CHUNK` of them); returns those it still held (the others were taken over)."""
        if not conv_ids:
            return set()
        held: set[str] = set()
        with self._write_one():
            until = self._clock() + lease
            for chunk in in_chunks(conv_ids):
                marks = ", ".join("?" * len(chunk))
                held.update(row[0] for row in self.conn.execute(
                    f"""UPDATE conversation_claims SET lease_until = ? WHERE conversation_id IN ({marks})
                        AND owner_pid = ? AND owner_started = ? AND owner_token = ? RETURNING conversation_id""",
                    [until, *chunk, owner.pid, owner.started, owner.token],
                ).fetchall())
        return held

    def release_claim(self, conv_id: str, owner: ClaimOwner, *, turn_id: str | None = None) -> bool:
        """Delete `owner`'s claim (with `turn_id`, only one taken for that turn); False if none was."""
        sql = """DELETE FROM conversation_claims WHERE conversation_id = ?
                 AND owner_pid = ? AND owner_started = ? AND owner_token = ?"""
        params: list = [conv_id, owner.pid, owner.started, owner.token]
        if turn_id is not None:
            sql += " AND turn_id = ?"
            params.append(turn_id)
        with self._write_one():
            return bool(self.db.execute(sql, params).rowcount)

    def holds_claim(self, conv_id: str, owner: ClaimOwner, *, turn_id: str | None = None,
                    for_at_least: float | None = None) -> bool:
        """Whether `owner` holds the conversation's claim now (a read: nothing to release if not).

        With `turn_id`, a claim taken for that turn; with `for_at_least`, one whose lease has
        that many seconds left (`queue_message` took it with the turn's message)."""
        sql = """SELECT lease_until FROM conversation_claims WHERE conversation_id = ?
                 AND owner_pid = ? AND owner_started = ? AND owner_token = ?"""
        params: list = [conv_id, owner.pid, owner.started, owner.token]
        if turn_id is not None:
            sql += " AND turn_id = ?"
            params.append(turn_id)
        lease_until = self._scalar(sql, params)
        if lease_until is None:
            return False
        return for_at_least is None or lease_until - self._clock() >= for_at_least

    def claim_of(self, conv_id: str) -> dict | None:
        """The claim row of a conversation with `live` (holder alive, lease running), or None."""
        row = self._one("SELECT * FROM conversation_claims WHERE conversation_id = ?", [conv_id])
        if row is not None:
            row["live"] = row["lease_until"] > self._clock() and owner_alive(row["owner_pid"], row["owner_started"])
        return row

    def claimed_elsewhere(self, conv_id: str, owner: ClaimOwner) -> bool:
        """Another live claimant holds this conversation now (so leave its binding alone)."""
        row = self.claim_of(conv_id)
        return bool(row and row["live"] and not _same_owner(
            (row["owner_pid"], row["owner_started"], row["owner_token"]), owner))

    def queue_message(self, conv_id: str, item: dict, *, approval_timeout: float | None = None,
                      claim: ClaimOwner | None = None, lease: float = 0.0) -> tuple[dict, dict]:
        """A user message and its queued turn; returns (item in wire form, turn).
        `queue_message_claiming` says whether the claim came with it."""
        wire, turn, _ = self.queue_message_claiming(conv_id, item, approval_timeout=approval_timeout,
                                                    claim=claim, lease=lease)
        return wire, turn

    def queue_message_claiming(self, conv_id: str, item: dict, *, approval_timeout: float | None = None,
                               claim: ClaimOwner | None = None, lease: float = 0.0) -> tuple[dict, dict, bool]:
        """A user message and its queued turn; returns (item in wire form, turn, whether `claim` took
        the conversation's claim for it: a caller need not read that back).

        `approval_timeout` is stored on the turn: how long an approval of it
        waits for an answer (seconds; 0 refuses at once; None waits until answered).

        While the conversation is busy (a turn queued or running, or a claim
        on it) the item waits in `pending_items` and joins the conversation
        when its turn holds the claim (`place_pending`): it then comes after
        the answer it waited for. Otherwise it is appended at once, and with
        `claim` the conversation's claim is taken for the new turn in the same
        transaction, for `lease` seconds: the turn service that runs it finds it
        held (`holds_claim`) and writes nothing to take it (one transaction a turn fewer).
        """
        if approval_timeout is not None and not approval_timeout >= 0:
            raise ValueError(f"approval_timeout must be >= 0 or None, not {approval_timeout!r}")
        with self._write():
            # whether it exists and is busy, and what appending the message needs of its row, in
            # one statement: every message takes this way
            head = self.conn.execute(
                f"""SELECT {HEAD_COLUMNS},
                          EXISTS (SELECT 1 FROM turns WHERE conversation_id = ?
                                        AND status IN ('queued', 'running', 'waiting'))
                       OR EXISTS (SELECT 1 FROM conversation_claims WHERE conversation_id = ?)
                   FROM conversations WHERE id = ?""",
                [conv_id, conv_id, conv_id]).fetchone()
            if head is None:
                raise NotFoundError(f"conversation {conv_id!r} not found")
            busy = head[3]
            if busy:
                now = self._clock()
                wire = _wire_item(item, response_id=None, status=None, created_at=now)
                self.db.execute(
                    "INSERT INTO pending_items (conversation_id, id, data, created_at) VALUES (?, ?, ?, ?)",
                    [conv_id, wire["id"], json.dumps(item | {"id": wire["id"]}), now])
            else:
                wire = self._insert_items(conv_id, [item], turn_id=None, response_id=None, status=None,
                                          output_indexed=False, head=head)[0]
            turn_id = ids.new_id(ids.TURN)
            now = self._clock()
            turn = _turn(self._written(  # a new turn: no step, no output (nothing to read after it)
                """INSERT INTO turns (id, conversation_id, input_item_id, status, owner_pid, created_at,
                       approval_timeout) VALUES (?, ?, ?, 'queued', ?, ?, ?)""" + TURN_RETURNING,
                [turn_id, conv_id, wire["id"], os.getpid(), now, approval_timeout],
            ))
            claimed = False
            if claim is not None and not busy:  # no claim exists (busy counts one), so none is replaced
                claimed = True
                self.db.execute(
                    """INSERT INTO conversation_claims (conversation_id, turn_id, owner_pid, owner_started,
                           owner_token, lease_until, claimed_at) VALUES (?, ?, ?, ?, ?, ?, ?)""",
                    [conv_id, turn_id, claim.pid, claim.started, claim.token, now + lease, now])
        return wire, turn, claimed  # type: ignore[return-value]

    def place_pending(self, conv_id: str, item_id: str | None) -> dict | None:
        """Append a pending item at the conversation's end; None if it is not pending."""
        if item_id is None:
            return None
        # A turn's pending item is stored with the turn (`queue_message`) and only ever leaves:
        # absent now, it stays absent, so most turns (their message appended at once) write nothing.
        if self._scalar("SELECT 1 FROM pending_items WHERE conversation_id = ? AND id = ?",
                        [conv_id, item_id]) is None:
            return None
        with self._write():
            row = self.conn.execute(
                "SELECT data FROM pending_items WHERE conversation_id = ? AND id = ?", [conv_id, item_id]).fetchone()
            if row is None:
                return None
            self.db.execute("DELETE FROM pending_items WHERE conversation_id = ? AND id = ?", [conv_id, item_id])
            if self._scalar("SELECT 1 FROM conversation_items WHERE conversation_id = ? AND id = ?",
                            [conv_id, item_id]):
                return None
            return self._insert_items(conv_id, [json.loads(row[0])], turn_id=None, response_id=None,
                                      status=None, output_indexed=False)[0]


def _same_owner(row: tuple, owner: ClaimOwner) -> bool:
    return (row[0], row[1], row[2]) == (owner.pid, owner.started, owner.token)
