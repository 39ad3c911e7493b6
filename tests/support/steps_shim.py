"""TEMPORARY: the contract's step/approval store methods in memory, until helper S's store9 is merged.

Installed on `Store` only when it lacks `steps` (so it vanishes once the real mixins land).
"""

from __future__ import annotations

import itertools
from typing import Any

from omnigent.store import Store

_ids = itertools.count(1)


def _state(store: Any) -> dict[str, Any]:
    if not hasattr(store, "_shim"):
        store._shim = {"steps": {}, "approvals": {}, "rules": {}, "usage": {}}
    return store._shim


def steps(self, turn_id):
    rows = _state(self)["steps"].get(turn_id, {})
    return [dict(rows[k]) for k in sorted(rows)]


def begin_step(self, conv_id, turn_id, step, kind, *, call_id=None, tool=None, arguments=None, attempt=0):
    rows = _state(self)["steps"].setdefault(turn_id, {})
    row = rows.get(step)
    if row is None:
        row = rows[step] = {"turn_id": turn_id, "step": step, "kind": kind, "status": "running",
                            "call_id": call_id, "tool": tool, "arguments": arguments, "attempt": attempt,
                            "usage": None, "error": None, "started_at": self._clock(), "ended_at": None}
    elif row["status"] in ("running", "waiting"):
        row["attempt"] = attempt
    return dict(row)


def _row(self, turn_id, step):
    return _state(self)["steps"].get(turn_id, {}).get(step)


def finish_model_step(self, conv_id, turn_id, step, items, response_id, usage):
    row = _row(self, turn_id, step)
    if row is None or row["status"] not in ("running", "waiting"):
        return False
    with self._write():
        self._insert_items(conv_id, list(items), turn_id=turn_id, response_id=response_id, status=None,
                           output_indexed=True)
    row.update(status="completed", usage=usage, ended_at=self._clock())
    if usage:
        total = _state(self)["usage"].setdefault(turn_id, {})
        for k, v in usage.items():
            if isinstance(v, int):
                total[k] = total.get(k, 0) + v
    return True


def finish_tool_step(self, conv_id, turn_id, step, call_id, output, status):
    row = _row(self, turn_id, step)
    if row is None or row["status"] not in ("running", "waiting"):
        return False
    item = {"type": "function_call_output", "call_id": call_id, "output": output}
    with self._write():
        self._insert_items(conv_id, [item], turn_id=turn_id, response_id=None, status="completed",
                           output_indexed=False)
    done = status in ("completed", "error", "timeout", "refused")
    row.update(status="completed" if done else status, ended_at=self._clock())
    row["item_status"] = "completed" if done else status
    return True


def end_step(self, turn_id, step, status, error=None):
    row = _row(self, turn_id, step)
    if row is None or row["status"] not in ("running", "waiting"):
        return False
    row.update(status=status, error=error, ended_at=self._clock())
    return True


def set_step_waiting(self, turn_id, step, waiting):
    row = _row(self, turn_id, step)
    if row is not None and row["status"] in ("running", "waiting"):
        row["status"] = "waiting" if waiting else "running"


def create_approval(self, conv_id, turn_id, step, call_id, tool, arguments, target, diff, expires_at):
    approval = {"id": f"appr_{next(_ids)}", "conversation_id": conv_id, "turn_id": turn_id, "step": step,
                "call_id": call_id, "tool": tool, "arguments": arguments, "target": target, "diff": diff,
                "status": "pending", "decision": None, "decided_by": None, "created_at": self._clock(),
                "decided_at": None, "expires_at": expires_at}
    _state(self)["approvals"][approval["id"]] = approval
    return dict(approval)


def get_approval(self, approval_id):
    a = _state(self)["approvals"].get(approval_id)
    return dict(a) if a else None


def list_approvals(self, conv_id, status=None):
    return [dict(a) for a in _state(self)["approvals"].values()
            if a["conversation_id"] == conv_id and (status is None or a["status"] == status)]


_STATUS = {"allow": "allowed", "always": "allowed", "deny": "denied", "timeout": "denied",
           "cancelled": "cancelled", "expired": "expired"}


def resolve_approval(self, approval_id, decision, by):
    a = _state(self)["approvals"].get(approval_id)
    if a is None or a["status"] != "pending":
        return None
    a.update(status=_STATUS[decision], decision=decision, decided_by=by, decided_at=self._clock())
    if decision == "always":
        add_rule(self, a["conversation_id"], a["tool"], a["target"])
    return dict(a)


def add_rule(self, conv_id, tool, target):
    rules = _state(self)["rules"]
    key = (conv_id, tool, target)
    if key not in rules:
        rules[key] = {"id": f"rule_{next(_ids)}", "conversation_id": conv_id, "tool": tool, "target": target}
    return dict(rules[key])


def list_rules(self, conv_id):
    return [dict(r) for r in _state(self)["rules"].values() if r["conversation_id"] == conv_id]


def rule_matches(self, conv_id, tool, target):
    return (conv_id, tool, target) in _state(self)["rules"]


def install() -> None:
    if hasattr(Store, "steps"):
        return
    for fn in (steps, begin_step, finish_model_step, finish_tool_step, end_step, set_step_waiting,
               create_approval, get_approval, list_approvals, resolve_approval, add_rule, list_rules,
               rule_matches):
        setattr(Store, fn.__name__, fn)
    real_get_turn = Store.get_turn

    def get_turn(self, turn_id):
        row = real_get_turn(self, turn_id)
        if row is not None:
            row.setdefault("usage", _state(self)["usage"].get(turn_id))
            row.setdefault("approval_timeout", _state(self).get("timeouts", {}).get(turn_id))
        return row

    Store.get_turn = get_turn


def set_approval_timeout(store: Store, turn_id: str, timeout: float | None) -> None:
    """Shim stand-in for `queue_message(..., approval_timeout=)`."""
    _state(store).setdefault("timeouts", {})[turn_id] = timeout
