"""The `turn_steps` table: the steps of an agent turn, each stored before the next is taken.

A turn (one user message) runs as model steps (one request to the model)
and tool steps (one tool call), numbered 0, 1, 2 ... per turn. The loop
(server/agent_loop.py) resumes a turn from its first unfinished step, so
what this module guarantees is what recovery relies on:

- A step's output is written once. `finish_model_step` stores the model's
  items, completes the step and adds its usage to the turn in one
  transaction; `finish_tool_step` stores the call's `function_call_output`
  and completes the step in one. A second (late, duplicate) finish of the
  same step writes nothing and returns False.
- The items of a turn's steps carry the turn id and consecutive output
  slots (`output_index`), so the turn's earlier steps are found in order
  and the unique index (0001) backs the exactly-once rule.
- A model step that failed or was interrupted can be begun again (a new
  attempt); a step whose output is stored never is.

Needs `ItemsMixin` (for `_insert_items`) in the same `Store`.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._base import STEP_COLUMNS, Tables, _step

STEP_KINDS = ("model", "tool")
# what a tool call can end as (ToolResult.status); the first four are the tool's own answer
TOOL_STATUSES = ("completed", "error", "timeout", "refused", "interrupted", "cancelled", "not_run")
_TOOL_ANSWERED = frozenset({"completed", "error", "timeout", "refused"})
# how a model step ends without output (end_step)
MODEL_END_STATUSES = ("failed", "cancelled", "interrupted", "not_run")
_UNDER_WAY_SQL = "('running', 'waiting')"  # a step's statuses before it ends
_SELECT = f"SELECT {', '.join(STEP_COLUMNS)} FROM turn_steps"
_RETURNING = f" RETURNING {', '.join(STEP_COLUMNS)}"


@dataclass(frozen=True)
class FinishedStep:
    """What `complete_model_step` wrote, as a read after it would give it."""

    items: list[dict]          # the step's items in wire form, in order (`list_turn_items`' form)
    first_index: int | None    # their first output slot (0: no earlier step of the turn stored any); None: no items
    turn_usage: dict | None    # the turn's usage summed over its steps, this one's included (`turn_usage`)


class StepsMixin(Tables):
    if TYPE_CHECKING:  # ItemsMixin's, beside this one in `Store`
        def _insert_items(self, conv_id: str, items: list[dict], *, turn_id: str | None,
                          response_id: str | None, status: str | None, output_indexed: bool,
                          first_index: int = 0) -> list[dict]: ...
        def _next_output_index(self, conv_id: str, turn_id: str) -> int: ...

    def steps(self, turn_id: str) -> list[dict]:
        """The turn's steps, ordered by step number."""
        return [_step(r) for r in self._all(_SELECT + " WHERE turn_id = ? ORDER BY step", [turn_id])]

    def get_step(self, turn_id: str, step: int) -> dict | None:
        return _step(self._one(_SELECT + " WHERE turn_id = ? AND step = ?", [turn_id, step]))

    def begin_step(self, conv_id: str, turn_id: str, step: int, kind: str, *, call_id: str | None = None,
                   tool: str | None = None, arguments: str | None = None, attempt: int = 0,
                   waiting: bool = False) -> dict:
        """Insert the step as 'running'; a step that exists is returned unchanged.

        Idempotent: asking again for the same attempt changes nothing. Asked
        with a higher `attempt` (the step dispatched again after a runner was
        lost), a step whose output is not stored records that attempt, and one
        that had failed or was interrupted or cancelled is 'running' again.
        `waiting`: then, in the same transaction, `set_step_waiting(True)`.
        """
        if kind not in STEP_KINDS:
            raise ValueError(f"step kind must be one of {STEP_KINDS}, not {kind!r}")
        with self._write():
            try:
                inserted = self._written(  # the new row as written (a step that exists: none)
                    """INSERT OR IGNORE INTO turn_steps (turn_id, step, conversation_id, kind, status, call_id,
                           tool, arguments, attempt, started_at) VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?, ?)"""
                    + _RETURNING, [turn_id, step, conv_id, kind, call_id, tool, arguments, attempt, self._clock()])
            except sqlite3.IntegrityError:  # a foreign key: say so when it is the conversation that is missing
                self._require_conversation(conv_id)
                raise
            if inserted is None and not self._stored(turn_id, step):
                self.db.execute(
                    f"""UPDATE turn_steps SET attempt = ?, error = NULL, ended_at = NULL, started_at = ?,
                            status = CASE WHEN status IN {_UNDER_WAY_SQL} THEN status ELSE 'running' END
                        WHERE turn_id = ? AND step = ? AND attempt < ?""",
                    [attempt, self._clock(), turn_id, step, attempt])
            if waiting:
                self._set_waiting(turn_id, step, True)
        if inserted is not None and not waiting:  # nothing changed it since: every fresh step's way
            return _step(inserted)
        return self.get_step(turn_id, step)  # type: ignore[return-value]

    def _stored(self, turn_id: str, step: int) -> bool:
        # the step's output is in the store: a completed model step, or a tool step that ended
        # (finish_tool_step is the only way a tool step ends)
        return bool(self._scalar(
            """SELECT (kind = 'model' AND status = 'completed') OR (kind = 'tool' AND ended_at IS NOT NULL)
               FROM turn_steps WHERE turn_id = ? AND step = ?""", [turn_id, step]))

    def finish_model_step(self, conv_id: str, turn_id: str, step: int, items: list[dict],
                          response_id: str | None, usage: dict | None) -> bool:
        """Once: the step 'completed', its items appended, its usage added to the turn's.

        One transaction. False, and nothing written, if the step had already ended.
        """
        return self.complete_model_step(conv_id, turn_id, step, items, response_id, usage) is not None

    def complete_model_step(self, conv_id: str, turn_id: str, step: int, items: list[dict],
                            response_id: str | None, usage: dict | None) -> FinishedStep | None:
        """`finish_model_step`, saying what it wrote (None: nothing, the step had ended): the agent
        loop ends most turns in the same transaction, and need not read any of it back."""
        with self._write():
            if not self._end_step(conv_id, turn_id, step, "model", None, "status = 'completed', usage = ?, error = NULL",
                                  [json.dumps(usage) if usage else None]):
                return None
            first, stored = None, []
            if items:
                first = self._next_output_index(conv_id, turn_id)
                stored = self._insert_items(conv_id, list(items), turn_id=turn_id, response_id=response_id,
                                            status=None, output_indexed=True, first_index=first)
            total = self._add_turn_usage(turn_id, step, usage)
        return FinishedStep(stored, first, total)

    def _end_step(self, conv_id: str, turn_id: str, step: int, kind: str, call_id: str | None,
                  assignments: str, values: list[Any]) -> bool:
        # Caller holds the write transaction. The step's row set to its end (`assignments`, and
        # `ended_at`) where it is under way; False, and nothing written, where it had ended.
        # The usual way is this one statement: the step was begun (`begin_step`), and its row says
        # the session exists. Otherwise the session is checked, and a step never begun (a call
        # stored not_run, say) is begun first.
        sql = (f"UPDATE turn_steps SET {assignments}, ended_at = ? WHERE turn_id = ? AND step = ?"
               f" AND status IN {_UNDER_WAY_SQL}")
        if self.conn.execute(sql, [*values, self._clock(), turn_id, step]).rowcount:
            return True
        self._require_conversation(conv_id)
        if self._scalar("SELECT 1 FROM turn_steps WHERE turn_id = ? AND step = ?", [turn_id, step]):
            return False  # ended already
        self.db.execute(
            """INSERT INTO turn_steps (turn_id, step, conversation_id, kind, status, call_id, started_at)
               VALUES (?, ?, ?, ?, 'running', ?, ?)""", [turn_id, step, conv_id, kind, call_id, self._clock()])
        self.conn.execute(sql, [*values, self._clock(), turn_id, step])
        return True

    def _add_turn_usage(self, turn_id: str, step: int, usage: dict | None) -> dict | None:
        # caller holds the write transaction: the turn's usage with this step's added; returns the sum.
        # A turn's first step finds none stored yet (only a completed model step adds any): one
        # statement then, where reading the sum first took two.
        if usage and step == 0:
            first = add_usage({}, usage)
            if self.conn.execute("UPDATE turns SET usage = ? WHERE id = ? AND usage IS NULL",
                                 [json.dumps(first), turn_id]).rowcount:
                return first
        current = self._scalar("SELECT usage FROM turns WHERE id = ?", [turn_id])
        total = json.loads(current) if current else None
        if usage:
            total = add_usage(total or {}, usage)
            self.db.execute("UPDATE turns SET usage = ? WHERE id = ?", [json.dumps(total), turn_id])
        return total

    def finish_tool_step(self, conv_id: str, turn_id: str, step: int, call_id: str, output: str,
                         status: str) -> bool:
        """Once: the call's `function_call_output` appended and the step ended, in one transaction.

        `status` is the tool's outcome (ToolResult.status). The tool's own
        answers (completed, error, timeout, refused) are stored 'completed'
        (the outcome kept in the step's `error` when it is not 'completed');
        interrupted, cancelled and not_run are the item's and the step's
        status. False, and nothing written, if the step had already ended.
        """
        if status not in TOOL_STATUSES:
            raise ValueError(f"tool step status must be one of {TOOL_STATUSES}, not {status!r}")
        if not isinstance(output, str):
            raise TypeError(f"a tool's output must be a str, not {type(output).__name__}")
        stored_status = "completed" if status in _TOOL_ANSWERED else status
        with self._write():
            if not self._end_step(conv_id, turn_id, step, "tool", call_id,
                                  "status = ?, error = ?, call_id = COALESCE(call_id, ?)",
                                  [stored_status, None if status == "completed" else status, call_id]):
                return False
            item = {"type": "function_call_output", "call_id": call_id, "output": output}
            self._insert_items(conv_id, [item], turn_id=turn_id, response_id=None, status=stored_status,
                               output_indexed=True, first_index=self._next_output_index(conv_id, turn_id))
        return True

    def end_step(self, turn_id: str, step: int, status: str, error: str | None = None) -> bool:
        """A step under way ends without output (a model step failed, was cancelled or interrupted).

        False if it was not under way (already ended, or never begun).
        """
        if status not in MODEL_END_STATUSES:
            raise ValueError(f"a step ends with end_step as one of {MODEL_END_STATUSES}, not {status!r}")
        with self._write():
            return bool(self.db.execute(
                f"""UPDATE turn_steps SET status = ?, error = ?, ended_at = ?
                    WHERE turn_id = ? AND step = ? AND status IN {_UNDER_WAY_SQL}""",
                [status, error, self._clock(), turn_id, step]).rowcount)

    def set_step_waiting(self, turn_id: str, step: int, waiting: bool) -> bool:
        """A step under way waits (for an answer, for a runner to run it), or runs: 'running' <-> 'waiting'.

        Only the step changes: the turn's own status is the loop's to set.
        False if the step was not in the other state.
        """
        with self._write():
            return self._set_waiting(turn_id, step, waiting)

    def _set_waiting(self, turn_id: str, step: int, waiting: bool) -> bool:
        # caller holds the write transaction
        new, old = ("waiting", "running") if waiting else ("running", "waiting")
        return bool(self.db.execute(
            "UPDATE turn_steps SET status = ? WHERE turn_id = ? AND step = ? AND status = ?",
            [new, turn_id, step, old]).rowcount)

    def turn_usage(self, turn_id: str) -> dict | None:
        """The turn's usage summed over its steps so far (None: none reported)."""
        raw = self._scalar("SELECT usage FROM turns WHERE id = ?", [turn_id])
        return json.loads(raw) if raw else None

    def session_usage(self, conv_id: str) -> dict:
        """Usage summed over the session's turns: {input_tokens, output_tokens, total_tokens, turns}.

        `turns` counts the turns that reported usage.
        """
        totals: dict[str, Any] = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "turns": 0}
        for (raw,) in self.conn.execute(
                "SELECT usage FROM turns WHERE conversation_id = ? AND usage IS NOT NULL", [conv_id]):
            usage = json.loads(raw)
            for key in ("input_tokens", "output_tokens", "total_tokens"):
                value = usage.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    totals[key] += value
            totals["turns"] += 1
        return totals


def add_usage(total: dict, more: dict) -> dict:
    """`total` + `more`, key by key: numbers are added, nested dicts (`*_details`) likewise."""
    out = dict(total)
    for key, value in more.items():
        if isinstance(value, bool):
            out.setdefault(key, value)
        elif isinstance(value, (int, float)):
            current = out.get(key)
            out[key] = (current if isinstance(current, (int, float)) and not isinstance(current, bool) else 0) + value
        elif isinstance(value, dict):
            current = out.get(key)
            out[key] = add_usage(current if isinstance(current, dict) else {}, value)
        elif key not in out:
            out[key] = value
    return out
