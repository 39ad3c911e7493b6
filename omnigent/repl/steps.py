"""How the agent loop's steps read on a terminal: one line per tool call, one per result, one per incident.

Pure text: the REPL's renderer, `-p` and `omnigent attach` all say the same
thing the same way. Every value that came from the model or a tool is
`neutralise`d and clipped to one line here, so a caller prints what it gets.

`Calls` remembers which calls and results were shown: the same call may be
announced by its stored item (`response.output_item.done`), by the tool
starting, by an approval request, and the result by the tool's completion
event or its stored output item; each is shown once.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..client import message_text
from .safe import neutralise

CALL_MARK = "⚙"
RESULT_MARK = "↳"
WIDTH = 100
KNOWN = ("shell", "read_file", "write_file", "edit_file", "list_dir", "grep")
SIDE_EFFECTING = frozenset({"shell", "write_file", "edit_file"})


def clip(text: str, width: int = WIDTH) -> str:
    """One neutralised line of at most `width` characters (whitespace runs collapsed)."""
    text = " ".join(neutralise(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _args(arguments: Any) -> dict[str, Any] | None:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def call_summary(tool: str, arguments: Any) -> str:
    """`shell: ls -la`, `edit_file: src/a.py`, `grep: TODO in src`; else `name(arguments)`."""
    if arguments in (None, ""):
        return clip(str(tool), 40)
    args = _args(arguments)
    if tool in KNOWN and args is not None:
        if tool == "shell":
            return f"shell: {clip(str(args.get('command', '')))}"
        if tool == "grep":
            where = f" in {args['path']}" if args.get("path") else ""
            glob = f" ({args['glob']})" if args.get("glob") else ""
            return f"grep: {clip(str(args.get('pattern', '')) + where + glob)}"
        return f"{tool}: {clip(str(args.get('path', '')))}"
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return f"{clip(str(tool), 40)}({clip(raw)})"


def call_line(tool: str, arguments: Any) -> str:
    return f"  {CALL_MARK} {call_summary(tool, arguments)}"


_EXIT = re.compile(r"exit code: -?\d+")
_STATUS_WORDS = {"error": "error", "timeout": "timed out", "refused": "refused", "interrupted": "interrupted",
                 "cancelled": "cancelled", "not_run": "not run", "not_approved": "not approved"}


def result_line(output: Any, status: str | None = None) -> str:
    """The first line of a tool's output (clipped), how many more there are, and its status if not plain."""
    text = neutralise(str(output or "")).strip("\n")
    lines = [line for line in text.splitlines() if line.strip()]
    exit_code = ""
    if lines and _EXIT.fullmatch(lines[-1].strip()):  # shell's last line: said at the end, not counted
        exit_code = " · " + lines.pop().strip().replace(":", "")
    if lines and lines[0].strip() == "(no output)":
        lines.pop(0)
    first = clip(lines[0], WIDTH - 20) if lines else "(no output)"
    more = f"  (+{len(lines) - 1} line{'s' if len(lines) > 2 else ''})" if len(lines) > 1 else ""
    more += exit_code
    word = _STATUS_WORDS.get(status or "")
    if word and not first.lower().startswith(word.split()[0]):
        first = f"{word}: {first}"
    return f"  {RESULT_MARK} {first}{more}"


def recovered_notice(event: dict[str, Any]) -> str:
    """One line for a `session.step.recovered` incident: which step, what was done about it, why."""
    step, kind, action = event.get("step"), event.get("kind"), event.get("action")
    tool = clip(str(event.get("tool") or "the tool"), 40)
    what = {
        "repeated": f"the model call (step {step}) was repeated",
        "rerun": f"{tool} (step {step}) was run again",
        "interrupted": f"{tool} (step {step}) was marked interrupted: it may or may not have taken effect",
        "asked_again": f"the approval for {tool} (step {step}) is asked again",
        "not_run": f"{tool} (step {step}) was not run",
    }.get(str(action), f"{kind} step {step}: {clip(str(action), 40)}")
    reason = clip(str(event.get("reason") or ""), 160)
    if reason:  # the server says what happened and what is done about it
        which = tool if event.get("tool") else str(kind or "model")
        return f"recovered: step {step} ({which}): {reason}"
    return f"recovered: {what}"


def not_approved_line(tool: str) -> str:
    """The stderr line of a call refused because nobody could be asked (`-p`, piped stdin)."""
    return (f"omnigent: {neutralise(tool)} call not approved (no terminal to ask); "
            f"rerun with --permission-mode auto to allow it")


def where_stopped(step: dict[str, Any] | None, *, asking: bool = False) -> str:
    """Where an interrupted turn stopped, from its last step row (None: before its first step).

    `asking`: an approval of that step is still pending (the question was on
    screen when omnigent stopped), whatever the row's own status says.
    """
    if not step:
        return "waiting for the model"
    tool = clip(str(step.get("tool") or "a tool"), 40)
    if step.get("kind") == "tool":
        if step.get("status") == "waiting" or asking and step.get("status") in ("running", "waiting"):
            return f"waiting for approval of {tool}"
        if step.get("status") in ("running", "interrupted"):
            return f"in tool {tool}"
    return "waiting for the model"


def final_text(output: list[dict[str, Any]]) -> str:
    """The assistant text after the last tool call or result of a turn's output items."""
    last: list[str] = []
    for item in output:
        kind = item.get("type", "message")
        if kind in ("function_call", "function_call_output"):
            last = []
        elif kind == "message" and item.get("role", "assistant") == "assistant":
            last.append(message_text(item))
    return "".join(last)


class Calls:
    """Which tool calls and results were already shown (by call id)."""

    def __init__(self) -> None:
        self.tools: dict[str, str] = {}  # call_id -> tool name
        self._called: set[str] = set()
        self._done: set[str] = set()

    def call(self, call_id: str | None, tool: str, arguments: Any) -> str | None:
        """The call's line the first time it is seen, else None."""
        if call_id:
            self.tools.setdefault(call_id, tool)
            if call_id in self._called:
                return None
            self._called.add(call_id)
        return call_line(tool, arguments)

    def result(self, call_id: str | None, output: Any, status: str | None) -> str | None:
        """The result's line the first time it is seen, else None."""
        if call_id:
            if call_id in self._done:
                return None
            self._done.add(call_id)
        return result_line(output, status)

    def seen(self, items: list[dict[str, Any]]) -> None:
        """Calls and results shown already (a transcript): not shown again when their events come."""
        for item in items:
            call_id = item.get("call_id")
            if not call_id:
                continue
            if item.get("type") == "function_call":
                self.tools.setdefault(call_id, str(item.get("name") or "tool"))
                self._called.add(call_id)
            elif item.get("type") == "function_call_output":
                self._done.add(call_id)

    def tool_of(self, call_id: str | None) -> str:
        return self.tools.get(call_id or "", "tool")


def event_call(event: dict[str, Any]) -> tuple[str | None, str, Any] | None:
    """(call_id, tool, arguments) if `event` announces a tool call, else None."""
    from protocol import events as ev

    kind = event.get("type")
    if kind == ev.ITEM_DONE:
        item = event.get("item") or {}
        if item.get("type") == "function_call":
            return item.get("call_id"), str(item.get("name") or "?"), item.get("arguments", "")
        return None
    if kind in (ev.TOOL_STARTED, ev.APPROVAL_REQUESTED, ev.TOOL_DONE):
        return event.get("call_id"), str(event.get("tool") or "?"), event.get("arguments", "")
    return None


def event_result(event: dict[str, Any]) -> tuple[str | None, Any, str | None] | None:
    """(call_id, output, status) if `event` carries a tool's result, else None."""
    from protocol import events as ev

    kind = event.get("type")
    item = event.get("item") or {}
    if kind == ev.TOOL_DONE:
        return event.get("call_id"), item.get("output", ""), event.get("status")
    if kind == ev.ITEM_DONE and item.get("type") == "function_call_output":
        status = item.get("status")
        return item.get("call_id"), item.get("output", ""), None if status == "completed" else status
    return None
