"""The `approvals` and `approval_rules` tables: asking a user before a side-effecting tool runs.

An approval belongs to the session, not to one terminal: any client may
answer it, and the first answer wins (`resolve_approval` changes a pending
row only, in one statement, so two answers racing store one). An "always"
answer also stores a rule, in the same transaction: this tool with this
exact target (the command for `shell`, the path for the file tools) needs
no question again in this session, until the rule is removed.
"""

from __future__ import annotations

from . import ids
from ._base import Tables

# decision -> the approval's status once resolved
DECISIONS = {
    "allow": "allowed",
    "always": "allowed",
    "deny": "denied",
    "timeout": "expired",
    "expired": "expired",
    "cancelled": "cancelled",
}
APPROVAL_STATUSES = ("pending", "allowed", "denied", "expired", "cancelled")
_APPROVAL_SELECT = """SELECT id, conversation_id, turn_id, step, call_id, tool, arguments, target, diff, status,
                             decision, decided_by, created_at, decided_at, expires_at FROM approvals"""
_RULE_SELECT = "SELECT id, conversation_id, tool, target, created_at FROM approval_rules"


class ApprovalsMixin(Tables):
    # --- approvals -------------------------------------------------------------

    def create_approval(self, conv_id: str, turn_id: str, step: int, call_id: str | None, tool: str,
                        arguments: str | None, target: str, diff: str | None, expires_at: float | None) -> dict:
        """A new 'pending' approval; `expires_at` (epoch seconds) is None when it waits until answered."""
        approval_id = ids.new_id(ids.APPROVAL)
        with self._write():
            self._require_conversation(conv_id)
            self.db.execute(
                """INSERT INTO approvals (id, conversation_id, turn_id, step, call_id, tool, arguments, target,
                       diff, status, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?)""",
                [approval_id, conv_id, turn_id, step, call_id, tool, arguments, target or "", diff or None,
                 self._clock(), expires_at])
        return self.get_approval(approval_id)  # type: ignore[return-value]

    def get_approval(self, approval_id: str) -> dict | None:
        return self._one(_APPROVAL_SELECT + " WHERE id = ?", [approval_id])

    def list_approvals(self, conv_id: str, status: str | None = None) -> list[dict]:
        """The session's approvals, oldest first; only those with `status` if given."""
        if status is not None and status not in APPROVAL_STATUSES:
            raise ValueError(f"approval status must be one of {APPROVAL_STATUSES}, not {status!r}")
        sql = _APPROVAL_SELECT + " WHERE conversation_id = ?"
        params: list = [conv_id]
        if status is not None:
            sql += " AND status = ?"
            params.append(status)
        return self._all(sql + " ORDER BY created_at, rowid", params)

    def resolve_approval(self, approval_id: str, decision: str, by: str | None) -> dict | None:
        """Answer a pending approval; None if it was not pending (answered, expired: a 409).

        `decision` is allow, deny, always (the users' answers) or timeout,
        cancelled, expired (the loop's). "always" also adds the session's rule
        for the approval's tool and target, in the same transaction.
        """
        if decision not in DECISIONS:
            raise ValueError(f"decision must be one of {', '.join(DECISIONS)}, not {decision!r}")
        with self._write():
            changed = self.db.execute(
                """UPDATE approvals SET status = ?, decision = ?, decided_by = ?, decided_at = ?
                   WHERE id = ? AND status = 'pending'""",
                [DECISIONS[decision], decision, by, self._clock(), approval_id]).rowcount
            if not changed:
                return None
            if decision == "always":
                row = self.conn.execute("SELECT conversation_id, tool, target FROM approvals WHERE id = ?",
                                        [approval_id]).fetchone()
                if row[2]:  # an unparsable call (no target) is asked about every time
                    self._insert_rule(*row)
        return self.get_approval(approval_id)

    # --- rules ("always") ------------------------------------------------------

    def _insert_rule(self, conv_id: str, tool: str, target: str) -> None:
        # Caller holds the write transaction; a rule that exists is kept as it is.
        self.db.execute(
            "INSERT OR IGNORE INTO approval_rules (id, conversation_id, tool, target, created_at)"
            " VALUES (?, ?, ?, ?, ?)",
            [ids.new_id(ids.RULE), conv_id, tool, target, self._clock()])

    def add_rule(self, conv_id: str, tool: str, target: str) -> dict:
        """Allow `tool` with exactly `target` for this session; the existing rule if there is one."""
        if not target:
            raise ValueError("a rule needs a target (the command or the path)")
        with self._write():
            self._require_conversation(conv_id)
            self._insert_rule(conv_id, tool, target)
        return self._one(_RULE_SELECT + " WHERE conversation_id = ? AND tool = ? AND target = ?",
                         [conv_id, tool, target])  # type: ignore[return-value]

    def list_rules(self, conv_id: str) -> list[dict]:
        """The session's rules, oldest first."""
        return self._all(_RULE_SELECT + " WHERE conversation_id = ? ORDER BY created_at, rowid", [conv_id])

    def remove_rule(self, conv_id: str, rule_id: str) -> bool:
        with self._write():
            return bool(self.db.execute("DELETE FROM approval_rules WHERE conversation_id = ? AND id = ?",
                                        [conv_id, rule_id]).rowcount)

    def rule_matches(self, conv_id: str, tool: str, target: str) -> bool:
        """A rule allows this exact (tool, target) in this session. An empty target never matches
        (an unparsable call is asked about every time)."""
        if not target:
            return False
        return self._scalar("SELECT 1 FROM approval_rules WHERE conversation_id = ? AND tool = ? AND target = ?",
                            [conv_id, tool, target]) is not None
