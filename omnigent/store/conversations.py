"""The `conversations` table: creating, listing and updating conversations, and their runner binding.

Guarantees: timestamps are strictly increasing across conversations (so
"newest" is never a tie), listing is one query with stable cursors, and a
conversation's runner changes only by compare-and-set (`bind_runner`) or
all at once for a lost runner (`rebind_runner`). Every change of binding
bumps the conversation's ownership `generation` in the same statement, so a
runner that comes back with a turn dispatched under an older generation is
known to be late (server/turns.py refuses it). A new conversation pins its
agent's spec (`session_agents`). Rows come back with the agent's name and the
item and message counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import ids
from ._base import ANY, CONVERSATION_FIELDS, KIND_DEFAULT, KIND_SUB_AGENT, PERMISSION_MODES, Tables, _Any
from .errors import NotFoundError

_CONVERSATION_COLUMNS = """
    SELECT c.id, c.kind, c.created_at, c.updated_at, c.title, c.agent_id,
           a.name AS agent_name, c.runner_id, c.reasoning_effort,
           c.model_override, c.workspace, c.generation, c.permission_mode, c.next_position AS item_count,
           c.forked_from, c.forked_at_item"""
_CONVERSATION_FROM = """
    FROM conversations c LEFT JOIN agents a ON a.id = c.agent_id
"""
_CONVERSATION_SELECT = _CONVERSATION_COLUMNS + """,
           (SELECT COUNT(*) FROM conversation_items i
             WHERE i.conversation_id = c.id AND i.type = 'message') AS message_count""" + _CONVERSATION_FROM
# without message_count, whose count reads every item: for the turn dispatch, several times a step
_CONVERSATION_ROW = _CONVERSATION_COLUMNS + _CONVERSATION_FROM


class ConversationsMixin(Tables):
    def create_conversation(
        self,
        *,
        agent_id: str | None,
        title: str = "",
        reasoning_effort: str | None = None,
        model_override: str | None = None,
        workspace: str | None = None,
        kind: int = KIND_DEFAULT,
        permission_mode: str | None = None,
    ) -> dict:
        if kind not in (KIND_DEFAULT, KIND_SUB_AGENT):
            raise ValueError(f"conversation kind must be 1 or 2, not {kind!r}")
        _check_mode(permission_mode)
        conv_id = ids.new_id(ids.CONVERSATION)
        with self._write():
            if agent_id is not None and self._scalar("SELECT 1 FROM agents WHERE id = ?", [agent_id]) is None:
                raise NotFoundError(f"agent {agent_id!r} not found")
            # A new conversation is the newest by both orderings.
            now = self._after("updated_at", self._after("created_at", self._clock()))
            self.db.execute(
                """INSERT INTO conversations (id, kind, created_at, updated_at, title, agent_id,
                       reasoning_effort, model_override, workspace, permission_mode)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                [conv_id, kind, now, now, title or "", agent_id, reasoning_effort, model_override, workspace,
                 permission_mode],
            )
            if agent_id is not None:  # the session runs this spec from now on, whatever is uploaded later
                self.db.execute(
                    """INSERT INTO session_agents (conversation_id, spec, bundle, updated_at)
                       SELECT ?, spec, NULL, ? FROM agents WHERE id = ?""", [conv_id, now, agent_id])
        return self.get_conversation(conv_id)  # type: ignore[return-value]

    def get_conversation(self, conv_id: str, *, counts: bool = True) -> dict | None:
        """The conversation's row; `counts=False` leaves out `message_count` (O(items) to count)."""
        return self._one((_CONVERSATION_SELECT if counts else _CONVERSATION_ROW) + " WHERE c.id = ?", [conv_id])

    def generation_of(self, conv_id: str) -> int:
        """The conversation's ownership generation (bumped by each rebinding); 0 if it is gone.

        One column, for the check a turn makes at each of its model's answers (server/turns.py)."""
        return int(self._scalar("SELECT generation FROM conversations WHERE id = ?", [conv_id]) or 0)

    def list_conversations(
        self,
        *,
        limit: int | None = 20,
        agent_name: str | None = None,
        agent_id: str | None = None,
        order: str = "desc",
        sort_by: str = "created_at",
        kind: int | None = KIND_DEFAULT,
        before: str | None = None,
        after: str | None = None,
    ) -> list[dict]:
        """Conversations in `sort_by` order (ties broken by id), newest first by default.

        `after`/`before` are conversation ids (cursors): only rows that come
        after/before that one in this listing order. `kind=None` lists all kinds.
        """
        if order not in ("asc", "desc"):
            raise ValueError(f"order must be 'asc' or 'desc', not {order!r}")
        if sort_by not in ("created_at", "updated_at"):
            raise ValueError(f"sort_by must be 'created_at' or 'updated_at', not {sort_by!r}")
        col = f"c.{sort_by}"
        where: list[str] = []
        params: list[Any] = []
        if kind is not None:
            where.append("c.kind = ?")
            params.append(kind)
        if agent_id is not None:
            where.append("c.agent_id = ?")
            params.append(agent_id)
        if agent_name is not None:
            # Names are unique, so a scalar subquery: lets the (agent_id, ts, id) index order rows.
            where.append("c.agent_id = (SELECT id FROM agents WHERE name = ?)")
            params.append(agent_name)
        forward = order == "desc"
        for cursor, comes_after in ((after, True), (before, False)):
            if cursor is None:
                continue
            value = self._scalar(f"SELECT {sort_by} FROM conversations WHERE id = ?", [cursor])
            if value is None:
                raise NotFoundError(f"conversation {cursor!r} not found")
            op = "<" if forward == comes_after else ">"
            where.append(f"({col}, c.id) {op} (?, ?)")
            params += [value, cursor]
        # With only `before`, walk away from the cursor then flip back.
        reverse = before is not None and after is None
        direction = "DESC" if forward != reverse else "ASC"
        sql = _CONVERSATION_SELECT
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY {col} {direction}, c.id {direction}"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        rows = self._all(sql, params)
        if reverse:
            rows.reverse()
        return rows

    def update_conversation(self, conv_id: str, **fields: Any) -> dict:
        """Set any of title, reasoning_effort, model_override, workspace, permission_mode."""
        unknown = set(fields) - CONVERSATION_FIELDS
        if unknown:
            raise TypeError(f"cannot update conversation field(s): {', '.join(sorted(unknown))}")
        _check_mode(fields.get("permission_mode"))
        if fields.get("title", "") is None:
            fields["title"] = ""
        with self._write():
            self._require_conversation(conv_id)
            if fields:
                assignments = ", ".join(f"{name} = ?" for name in fields)
                self.db.execute(
                    f"UPDATE conversations SET {assignments} WHERE id = ?", [*fields.values(), conv_id]
                )
        return self.get_conversation(conv_id)  # type: ignore[return-value]

    def bind_runner(self, conv_id: str, runner_id: str | None, *, expected: str | None | _Any) -> bool:
        """Compare-and-set the conversation's runner: bind only if it is now `expected`.

        `expected=ANY` binds unconditionally. Returns False when the current
        binding differs. `""` means None.
        """
        runner_id = runner_id or None
        with self._write():
            # a change of binding bumps the generation; binding the same runner again does not
            bump = "generation = generation + (runner_id IS NOT ?)"
            if expected is ANY:
                cur = self.db.execute(f"UPDATE conversations SET {bump}, runner_id = ? WHERE id = ?",
                                      [runner_id, runner_id, conv_id])
            else:
                cur = self.db.execute(
                    f"UPDATE conversations SET {bump}, runner_id = ? WHERE id = ? AND runner_id IS ?",
                    [runner_id, runner_id, conv_id, expected or None],
                )
            if cur.rowcount:
                return True
            self._require_conversation(conv_id)
            return False

    def set_runner(self, conv_id: str, runner_id: str | None) -> None:
        """Bind (or with None, unbind) unconditionally."""
        self.bind_runner(conv_id, runner_id, expected=ANY)

    def rebind_runner(self, old_runner_id: str, new_runner_id: str) -> list[str]:
        """Move every conversation bound to `old_runner_id` to `new_runner_id`, atomically.

        Returns the ids moved (sorted).
        """
        with self._write():
            moved = [
                r[0]
                for r in self.conn.execute(
                    "SELECT id FROM conversations WHERE runner_id = ? ORDER BY id", [old_runner_id]
                )
            ]
            if moved:
                self.db.execute(
                    "UPDATE conversations SET runner_id = ?, generation = generation + 1 WHERE runner_id = ?",
                    [new_runner_id, old_runner_id],
                )
        return moved

    def conversations_for_runner(self, runner_id: str) -> list[str]:
        """Ids of the conversations bound to `runner_id`."""
        return [
            r[0] for r in self.conn.execute("SELECT id FROM conversations WHERE runner_id = ? ORDER BY id", [runner_id])
        ]
    def runner_loads(self, runner_ids: Iterable[str]) -> dict[str, int]:
        """How many conversations are bound to each of `runner_ids` (0 for none)."""
        runner_ids = list(runner_ids)
        loads = dict.fromkeys(runner_ids, 0)
        if runner_ids:
            marks = ", ".join("?" * len(runner_ids))
            for runner_id, count in self.conn.execute(
                f"SELECT runner_id, COUNT(*) FROM conversations WHERE runner_id IN ({marks}) GROUP BY runner_id",
                runner_ids,
            ):
                loads[runner_id] = count
        return loads


def _check_mode(mode: str | None) -> None:
    if mode is not None and mode not in PERMISSION_MODES:
        raise ValueError(f"permission_mode must be one of {', '.join(PERMISSION_MODES)} or None, not {mode!r}")
