"""The store's approvals and "always" rules (store/approvals.py): the first answer wins."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnigent.store import NotFoundError, Store, is_id


@pytest.fixture
def store(tmp_path: Path):
    with Store(tmp_path / "chat.db") as s:
        yield s


@pytest.fixture
def conv(store: Store) -> dict:
    return store.create_conversation(agent_id=None)


def ask(store: Store, conv: dict, tool: str = "shell", target: str = "rm -rf build", **kw) -> dict:
    return store.create_approval(conv["id"], kw.get("turn_id", "turn_x"), kw.get("step", 1), "c1", tool,
                                 f'{{"command": "{target}"}}', target, kw.get("diff"), kw.get("expires_at"))


def test_create_and_read(store: Store, conv: dict):
    approval = ask(store, conv, expires_at=1234.5, diff="--- a\n+++ b\n")
    assert is_id(approval["id"], "appr")
    assert {k: approval[k] for k in ("conversation_id", "turn_id", "step", "call_id", "tool", "target", "diff",
                                     "status", "decision", "decided_by", "decided_at", "expires_at")} == {
        "conversation_id": conv["id"], "turn_id": "turn_x", "step": 1, "call_id": "c1", "tool": "shell",
        "target": "rm -rf build", "diff": "--- a\n+++ b\n", "status": "pending", "decision": None,
        "decided_by": None, "decided_at": None, "expires_at": 1234.5}
    assert approval["arguments"] == '{"command": "rm -rf build"}'
    assert store.get_approval(approval["id"]) == approval
    assert store.get_approval("appr_missing") is None
    with pytest.raises(NotFoundError):
        store.create_approval("conv_missing", "t", 0, None, "shell", None, "", None, None)


@pytest.mark.parametrize("decision,status", [("allow", "allowed"), ("always", "allowed"), ("deny", "denied"),
                                             ("timeout", "expired"), ("expired", "expired"),
                                             ("cancelled", "cancelled")])
def test_the_first_answer_wins(store: Store, conv: dict, decision: str, status: str):
    approval = ask(store, conv)
    done = store.resolve_approval(approval["id"], decision, "client")
    assert (done["status"], done["decision"], done["decided_by"]) == (status, decision, "client")
    assert done["decided_at"] is not None
    assert store.resolve_approval(approval["id"], "deny", "another") is None
    assert store.get_approval(approval["id"]) == done
    assert store.rule_matches(conv["id"], "shell", "rm -rf build") is (decision == "always")


def test_resolve_checks_its_arguments(store: Store, conv: dict):
    approval = ask(store, conv)
    with pytest.raises(ValueError):
        store.resolve_approval(approval["id"], "maybe", None)
    assert store.resolve_approval("appr_missing", "allow", None) is None
    assert store.get_approval(approval["id"])["status"] == "pending"


def test_listing_by_status(store: Store, conv: dict):
    first, second, third = (ask(store, conv, target=f"cmd {n}") for n in range(3))
    store.resolve_approval(second["id"], "allow", None)
    other = store.create_conversation(agent_id=None)
    ask(store, other)
    assert [a["id"] for a in store.list_approvals(conv["id"])] == [first["id"], second["id"], third["id"]]
    assert [a["id"] for a in store.list_approvals(conv["id"], "pending")] == [first["id"], third["id"]]
    assert [a["id"] for a in store.list_approvals(conv["id"], "allowed")] == [second["id"]]
    with pytest.raises(ValueError):
        store.list_approvals(conv["id"], "open")


def test_rules_are_exact_and_per_session(store: Store, conv: dict):
    rule = store.add_rule(conv["id"], "write_file", "src/a.py")
    assert is_id(rule["id"], "rule")
    assert store.add_rule(conv["id"], "write_file", "src/a.py") == rule  # one rule per (tool, target)
    other = store.create_conversation(agent_id=None)
    assert store.rule_matches(conv["id"], "write_file", "src/a.py")
    assert not store.rule_matches(conv["id"], "write_file", "src/a.py ")
    assert not store.rule_matches(conv["id"], "edit_file", "src/a.py")
    assert not store.rule_matches(other["id"], "write_file", "src/a.py")
    second = store.add_rule(conv["id"], "shell", "make test")
    assert store.list_rules(conv["id"]) == [rule, second]
    assert store.remove_rule(other["id"], rule["id"]) is False  # another session's rule id
    assert store.remove_rule(conv["id"], rule["id"]) is True
    assert store.remove_rule(conv["id"], rule["id"]) is False
    assert not store.rule_matches(conv["id"], "write_file", "src/a.py")
    assert store.list_rules(conv["id"]) == [second]
    with pytest.raises(ValueError):
        store.add_rule(conv["id"], "shell", "")
    with pytest.raises(NotFoundError):
        store.add_rule("conv_missing", "shell", "ls")


def test_always_without_a_target_adds_no_rule(store: Store, conv: dict):
    approval = store.create_approval(conv["id"], "t", 1, "c1", "shell", "not json", "", None, None)
    assert store.resolve_approval(approval["id"], "always", None)["status"] == "allowed"
    assert store.list_rules(conv["id"]) == []
    assert not store.rule_matches(conv["id"], "shell", "")


def test_a_deleted_session_takes_its_approvals_and_rules(store: Store, conv: dict):
    ask(store, conv)
    store.add_rule(conv["id"], "shell", "ls")
    with store._write():
        store.conn.execute("DELETE FROM conversations WHERE id = ?", [conv["id"]])
    assert store.list_approvals(conv["id"]) == [] and store.list_rules(conv["id"]) == []
