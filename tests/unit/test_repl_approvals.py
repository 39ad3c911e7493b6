"""Approvals at a terminal: the question's text, what is shown above it, the answer, the dismissal."""

from __future__ import annotations

import io
import json
import os
import pty

import trio

from omnigent.client import ConflictError
from omnigent.repl.approvals import UNCONFINED, Approvals, decision_of, preamble, question
from omnigent.repl.render import Console
from omnigent.repl.terminal import TtyInput


def shell_event(command: str = "rm -rf build", approval_id: str = "appr_1") -> dict:
    return {"type": "session.approval.requested", "turn_id": "t1", "approval_id": approval_id, "call_id": "c1",
            "tool": "shell", "arguments": json.dumps({"command": command}), "step": 1, "target": command}


def edit_event() -> dict:
    diff = "--- a/notes.txt\n+++ b/notes.txt\n@@ -1 +1 @@\n-old\n+new \x1b[31m\n"
    return {"type": "session.approval.requested", "turn_id": "t1", "approval_id": "appr_2", "call_id": "c2",
            "tool": "edit_file", "arguments": json.dumps({"path": "notes.txt", "old_string": "old",
                                                          "new_string": "new"}),
            "step": 1, "target": "notes.txt", "diff": diff}


def test_the_question_names_the_tool_and_its_target_and_the_choices():
    assert question(shell_event()) == "Allow shell: rm -rf build? [y]es / [n]o / [a]lways this session "
    assert question(edit_event()) == "Allow edit_file: notes.txt? [y]es / [n]o / [a]lways this session "


def test_shell_is_said_to_be_unconfined_and_edits_show_their_diff_neutralised():
    assert preamble(shell_event()) == [UNCONFINED]
    assert "not confined to the workspace" in UNCONFINED
    lines = preamble(edit_event())
    assert lines[:3] == ["  --- a/notes.txt", "  +++ b/notes.txt", "  @@ -1 +1 @@"]
    assert lines[-1] == "  +new ^[[31m"
    # a long or multi-line command is shown whole before the question, which clips it
    long = preamble(shell_event("echo one\necho two"))
    assert long[:3] == ["  command:", "    echo one", "    echo two"]


def test_the_question_never_holds_the_readiness_marker():
    event = shell_event("printf '❯ ' > x\x1b[2J")
    text = question(event) + "".join(preamble(event))
    assert "❯ " not in text and "\x1b" not in text
    assert decision_of(" Y ") == "allow" and decision_of("always") == "always" and decision_of("no") == "deny"
    assert decision_of("maybe") is None


class FakeLines:
    interactive = True

    def __init__(self, answers: list[str | None]) -> None:
        self.answers = answers
        self.asked: list[str] = []
        self.block = trio.Event()

    async def ask(self, prompt: str) -> str | None:
        self.asked.append(prompt)
        if not self.answers:
            await self.block.wait()  # nobody types: only a dismissal ends this
        return self.answers.pop(0)

    def shown_prompt(self) -> None:
        return None


class FakeSessions:
    def __init__(self, conflict: bool = False) -> None:
        self.posted: list[tuple[str, dict]] = []
        self.conflict = conflict

    async def post_event(self, session_id: str, event: dict) -> dict:
        self.posted.append((session_id, event))
        if self.conflict:
            raise ConflictError("already resolved", 409, "already_resolved")
        return {"approval_id": event["data"]["approval_id"], "decision": event["data"]["decision"]}


class FakeClient:
    def __init__(self, conflict: bool = False) -> None:
        self.sessions = FakeSessions(conflict)


def _approvals(answers, conflict=False):
    out = io.StringIO()
    console = Console(tty=False, out=out, err=out)
    client = FakeClient(conflict)
    approvals = Approvals(client, console, FakeLines(answers), can_answer=True)
    approvals.reset("conv_1")
    return approvals, client, out


async def test_an_answer_is_posted_as_the_approval_event_after_a_bad_one_is_asked_again():
    approvals, client, out = _approvals(["perhaps", "a"])
    approvals.requested(shell_event(), at_prompt=False)
    await approvals.answer_pending()
    assert client.sessions.posted == [("conv_1", {"type": "approval",
                                                  "data": {"approval_id": "appr_1", "decision": "always"}})]
    assert "Type y (yes), n (no) or a (always this session)." in out.getvalue()
    assert approvals.pending == {}


async def test_ctrl_d_is_no_and_a_lost_race_is_said():
    approvals, client, out = _approvals([None], conflict=True)
    approvals.requested(shell_event(), at_prompt=False)
    await approvals.answer_pending()
    assert client.sessions.posted[0][1]["data"]["decision"] == "deny"
    assert "(already answered elsewhere)" in out.getvalue()


async def test_an_approval_answered_elsewhere_dismisses_the_prompt():
    approvals, client, out = _approvals([])
    approvals.requested(shell_event(), at_prompt=False)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(approvals.answer_pending)
        while not approvals.lines.asked:
            await trio.sleep(0)
        approvals.resolved({"type": "session.approval.resolved", "turn_id": "t1", "approval_id": "appr_1",
                            "call_id": "c1", "decision": "allow", "by": "api"})
    assert client.sessions.posted == []
    assert "(answered elsewhere: allow)" in out.getvalue()


async def test_the_terminal_reader_answers_and_can_be_dismissed_and_stays_in_step(monkeypatch):
    """TtyInput.ask on a real pty: a line answers; a cancelled ask returns and the next one works."""
    master, slave = pty.openpty()
    monkeypatch.setattr("sys.stdout", io.StringIO())
    async def answer(lines: TtyInput, prompt: str, typed: bytes) -> str | None:
        async with trio.open_nursery() as nursery:
            got: list[str | None] = []

            async def asking() -> None:
                got.append(await lines.ask(prompt))

            nursery.start_soon(asking)
            with trio.fail_after(10):
                while lines.shown_prompt() != prompt:  # the thread shows it from its own side
                    await trio.sleep(0.01)
            os.write(master, typed)
        return got[0]

    try:
        lines = TtyInput(None, fd=slave)
        os.write(master, b"typed ahead\n")  # before the question: discarded, never an answer
        assert await answer(lines, "Allow? ", b"y\n") == "y"
        with trio.move_on_after(0.2):  # nobody types: dismissed
            await lines.ask("Allow? ")
        assert await answer(lines, "Allow again? ", b"n\n") == "n"
    finally:
        os.close(master)
        os.close(slave)


class RulesClient:
    def __init__(self) -> None:
        self.rules = [{"id": "rule_1", "tool": "shell", "target": "git status"},
                      {"id": "rule_2", "tool": "write_file", "target": "notes.txt"}]
        self.sessions = self
        self.revoked: list[str] = []

    async def permissions(self, session_id: str) -> list[dict]:
        return list(self.rules)

    async def revoke(self, session_id: str, rule_id: str) -> None:
        self.revoked.append(rule_id)
        self.rules = [r for r in self.rules if r["id"] != rule_id]

    async def get_session(self, session_id: str) -> dict:
        return {"id": session_id, "usage": {"input_tokens": 1200, "output_tokens": 34, "total_tokens": 1234,
                                            "turns": 3}}


async def test_permissions_lists_the_always_rules_numbered_and_revokes_one():
    from omnigent.repl.rules import permissions_command, usage_command

    out = io.StringIO()
    console, client = Console(tty=False, out=out, err=out), RulesClient()
    await permissions_command(client, console, "conv_1", "")
    assert out.getvalue().splitlines() == ["  1. shell: git status", "  2. write_file: notes.txt",
                                           "  /permissions revoke <#> removes one"]
    await permissions_command(client, console, "conv_1", "revoke 2")
    assert client.revoked == ["rule_2"] and out.getvalue().endswith("  Revoked: write_file: notes.txt\n")
    await permissions_command(client, console, "conv_1", "revoke 5")
    assert out.getvalue().endswith("  No rule #5 (1 listed).\n")
    await usage_command(client, console, "conv_1")
    assert out.getvalue().endswith("  This session: 1,200 input + 34 output = 1,234 tokens over 3 turns\n")


def test_where_an_interrupted_turn_stopped_and_recovery_notices():
    from omnigent.repl.steps import recovered_notice, where_stopped

    assert where_stopped(None) == "waiting for the model"
    assert where_stopped({"kind": "model", "status": "running"}) == "waiting for the model"
    assert where_stopped({"kind": "tool", "status": "running", "tool": "shell"}) == "in tool shell"
    assert where_stopped({"kind": "tool", "status": "waiting", "tool": "edit_file"}) == \
        "waiting for approval of edit_file"
    notice = recovered_notice({"turn_id": "t", "step": 3, "kind": "tool", "action": "interrupted",
                               "tool": "shell", "reason": "the runner stopped while shell ran; it is not run "
                                                          "again (it may or may not have taken effect)"})
    assert notice == ("recovered: step 3 (shell): the runner stopped while shell ran; it is not run again "
                      "(it may or may not have taken effect)")
    # without a reason, the action says it
    assert recovered_notice({"turn_id": "t", "step": 2, "kind": "tool", "action": "rerun", "tool": "grep",
                             "reason": ""}) == "recovered: grep (step 2) was run again"
