"""Approvals at a terminal: ask `Allow shell: <command>? [y]es / [n]o / [a]lways this session`, answer the server.

An approval belongs to the session, not to this terminal: `Approvals`
keeps the session's pending ones (from `session.approval.requested`
events, and from `GET .../approvals?status=pending` on resume or attach),
asks them one at a time through the REPL's one terminal reader
(`LineInput.ask`), and posts the answer. When one is resolved elsewhere
(another client answered, the turn was cancelled, it expired) the prompt
is dismissed and one line says so; an answer that loses the race (409) is
said the same way.

What is asked is shown whole before the question: a `shell` command is
said to run unconfined (not limited to the workspace), and a write or edit
shows its diff. The question never contains `❯ `, the REPL's readiness
marker: a command that holds one is shown with a no-break space instead.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import trio

from ..client import OmnigentError
from . import api
from .safe import neutralise
from .steps import clip

if TYPE_CHECKING:
    from ..client import OmnigentClient
    from .render import Console
    from .terminal import LineInput

CHOICES = "[y]es / [n]o / [a]lways this session"
UNCONFINED = "  shell is not confined to the workspace: the command runs with your permissions, anywhere"
ANSWERS = {"y": "allow", "yes": "allow", "n": "deny", "no": "deny", "a": "always", "always": "always"}
DIFF_LINES = 80  # a longer diff is cut, with the count of lines left out
PROMPT_MARK = "❯ "


def _no_marker(text: str) -> str:
    return text.replace(PROMPT_MARK, "❯\u00a0")


def target_of(event: dict[str, Any]) -> str:
    """What "always" would cover: the command (shell) or the path (file tools)."""
    target = event.get("target")
    if isinstance(target, str) and target:
        return target
    try:
        args = json.loads(event.get("arguments") or "{}")
    except (TypeError, ValueError):
        return ""
    if not isinstance(args, dict):
        return ""
    return str(args.get("command") if event.get("tool") == "shell" else args.get("path") or "")


def question(event: dict[str, Any]) -> str:
    """The prompt line: `Allow shell: ls -la? [y]es / [n]o / [a]lways this session `."""
    tool = clip(str(event.get("tool") or "tool"), 40)
    return _no_marker(f"Allow {tool}: {clip(target_of(event), 120)}? {CHOICES} ")


def preamble(event: dict[str, Any]) -> list[str]:
    """The lines shown above the question: the whole command, the unconfined warning, or the diff."""
    tool = event.get("tool")
    lines: list[str] = []
    if tool == "shell":
        command = neutralise(target_of(event))
        if "\n" in command or len(command) > 120:  # the question shows it clipped: show it whole first
            lines += ["  command:"] + ["    " + line for line in command.splitlines()]
        lines.append(UNCONFINED)
    diff = event.get("diff")
    if isinstance(diff, str) and diff.strip():
        diff_lines = neutralise(diff).splitlines()
        lines += ["  " + line for line in diff_lines[:DIFF_LINES]]
        if len(diff_lines) > DIFF_LINES:
            lines.append(f"  … {len(diff_lines) - DIFF_LINES} more lines of diff")
    return [_no_marker(line) for line in lines]


def decision_of(answer: str) -> str | None:
    return ANSWERS.get(answer.strip().lower())


def from_row(row: dict[str, Any]) -> dict[str, Any]:
    """A stored approval (`GET .../approvals`) in the shape of its `approval.requested` event."""
    return {"approval_id": row.get("id") or row.get("approval_id"), "call_id": row.get("call_id"),
            "tool": row.get("tool"), "arguments": row.get("arguments") or "", "target": row.get("target") or "",
            "diff": row.get("diff"), "turn_id": row.get("turn_id"), "step": row.get("step")}


class Approvals:
    """The attached session's pending approvals, asked at the terminal one at a time."""

    def __init__(self, client: OmnigentClient, console: Console, lines: LineInput, *, can_answer: bool) -> None:
        self.client = client
        self.console = console
        self.lines = lines
        self.can_answer = can_answer and lines.interactive
        self._watching = not can_answer  # `attach --watch`: others answer; a pipe is told by the refusal
        self.pending: dict[str, dict[str, Any]] = {}
        self.session_id: str | None = None
        self._changed = trio.Event()
        self._asking: tuple[str, trio.CancelScope] | None = None

    def reset(self, session_id: str | None) -> None:
        """Another session is attached (or none): forget the old one's approvals."""
        self.session_id = session_id
        self.pending.clear()
        if self._asking is not None:
            self._asking[1].cancel()

    def requested(self, event: dict[str, Any], *, at_prompt: bool) -> None:
        approval_id = str(event.get("approval_id"))
        self.pending[approval_id] = event
        self._changed.set()
        if self._watching:
            self.console.notice(f"approval requested: {question(event).split('? ')[0]}?")
        elif at_prompt:  # the reader is busy with the prompt: the next empty line answers it
            self.console.notice(f"approval requested: {question(event).split('? ')[0]}? (press Enter to answer)")

    def resolved(self, event: dict[str, Any]) -> None:
        approval_id = str(event.get("approval_id"))
        if self.pending.pop(approval_id, None) is None:
            return
        if self._asking is not None and self._asking[0] == approval_id:
            self._asking[1].cancel()
            decision = clip(str(event.get("decision") or "resolved"), 20)
            if decision in ("allow", "deny", "always"):
                self.console.notice(f"  (answered elsewhere: {decision})")
            else:  # cancelled with its turn, expired, timed out
                self.console.notice(f"  (approval {'timed out' if decision == 'timeout' else decision})")

    def replace(self, rows: list[dict[str, Any]]) -> None:
        """The server's list of pending approvals is the truth (after a resume or a replay)."""
        events = {str(e["approval_id"]): e for e in map(from_row, rows) if e["approval_id"]}
        kept = {k: self.pending.get(k, v) for k, v in events.items()}
        self.pending.clear()
        self.pending.update(kept)
        self._changed.set()

    async def fetch(self, session_id: str) -> list[dict[str, Any]]:
        """The session's pending approvals as stored (an older server without the route has none)."""
        try:
            return await api.pending_approvals(self.client, session_id)
        except OmnigentError as exc:
            if exc.status_code in (404, 405):
                return []
            raise

    async def refresh(self, session_id: str, turns: list[dict[str, Any]] | None = None) -> None:
        """Fetch the pending approvals (an older server without the route has none).

        With `turns` (the session's turn rows), only those of a turn still going
        are kept: one of a turn that was interrupted is asked again, with a new
        id, when /retry continues it, so answering the old one now would help nobody.
        """
        rows = await self.fetch(session_id)
        if turns is not None:
            going = {t.get("id") for t in turns if t.get("status") in ("queued", "running", "waiting")}
            rows = [r for r in rows if r.get("turn_id") is None or r.get("turn_id") in going]
        self.replace(rows)
        if rows and self._watching:
            for event in self.pending.values():
                self.console.notice(f"approval pending: {question(event).split('? ')[0]}?")

    async def answer_pending(self) -> list[str]:
        """Ask every pending approval now (the reader is free); returns the turns whose approval was answered."""
        answered: list[str] = []
        while self.can_answer and self.pending:
            event = next(iter(self.pending.values()))
            if await self.ask(event) and event.get("turn_id"):
                answered.append(str(event["turn_id"]))
        return answered

    async def keep_answering(self) -> None:
        """Ask approvals as they come, until cancelled (while a turn of ours runs)."""
        while True:
            await self.answer_pending()
            self._changed = trio.Event()
            if not self.pending:
                await self._changed.wait()

    async def ask(self, event: dict[str, Any]) -> bool:
        """Ask one approval and post the answer; False if it was dismissed or lost the race."""
        approval_id = str(event.get("approval_id"))
        self.console.end_line()
        for line in preamble(event):
            self.console.line(line)
        decision = None
        with trio.CancelScope() as scope:
            self._asking = (approval_id, scope)
            try:
                while decision is None:
                    self.console.before_read(sleeping=False)  # a clean line: the running status steps aside
                    try:
                        answer = await self.lines.ask(question(event))
                    finally:
                        self.console.after_read()
                    if answer is None:
                        decision = "deny"  # Ctrl-D: no
                        break
                    decision = decision_of(answer)
                    if decision is None:
                        self.console.line("  Type y (yes), n (no) or a (always this session).")
            finally:
                self._asking = None
        if decision is None:
            self.pending.pop(approval_id, None)
            return False  # dismissed: resolved elsewhere (said by `resolved`)
        self.pending.pop(approval_id, None)
        if self.session_id is None:
            return False
        try:
            await api.approve(self.client, self.session_id, approval_id, decision)
        except OmnigentError as exc:
            if exc.status_code == 409:
                self.console.notice("  (already answered elsewhere)")
            elif exc.status_code == 404:
                self.console.notice("  (that approval is gone)")
            else:
                raise
            return False
        return True
