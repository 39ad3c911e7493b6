"""How conversations look in a terminal: transcripts, live events, tables.

Everything here turns data into text; `Console` is the one place that writes,
so it alone knows whether the input prompt is on screen and must be drawn
again below late output (a notice, another client's turn). Every text that
came from the model, a tool or the store is `neutralise`d (see `safe`)
before styling is added, so it cannot drive the terminal.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, TextIO

from protocol import events as ev

from ..client import message_text
from . import steps
from .safe import neutralise

USER_MARK = "› "  # never the prompt glyph: tests wait for that one


class Style:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def _sgr(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.enabled and text else text

    def bold(self, text: str) -> str:
        return self._sgr("1", text)

    def dim(self, text: str) -> str:
        return self._sgr("2", text)

    def red(self, text: str) -> str:
        return self._sgr("31", text)


def _clip(text: str, width: int) -> str:
    text = " ".join(neutralise(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def render_item(item: dict[str, Any], style: Style) -> str | None:
    """One stored or streamed item as display lines (no trailing newline), None if not shown."""
    kind = item.get("type", "message")
    if kind == "message":
        text = neutralise(message_text(item))
        if item.get("role") == "user":
            return style.bold(USER_MARK + text.replace("\n", "\n  "))
        return text if item.get("role") == "assistant" else None
    if kind == "function_call":
        return style.dim(steps.call_line(str(item.get("name", "?")), item.get("arguments", "")))
    if kind == "function_call_output":
        status = item.get("status")
        return style.dim(steps.result_line(item.get("output", ""), None if status == "completed" else status))
    if kind == "reasoning":
        summary = " ".join(p.get("text", "") for p in item.get("summary") or () if isinstance(p, dict))
        return style.dim(f"  … {_clip(summary, 100)}") if summary else None
    return None


def rebound_notice(event: dict[str, Any]) -> str:
    """One line per incident: who died, why, who took over, how fast, and whether the turn reruns."""
    text = (f"runner {_short_id(event['old_runner_id'])} died ({_short_cause(event['cause'])}); "
            f"replaced by {_short_id(event['new_runner_id'])} in {event.get('downtime', 0.0):.2f} s")
    return text + ("; retrying your turn" if event.get("retrying") else "")


def retry_notice(event: dict[str, Any]) -> str:
    """One line per model retry, e.g. "model error 429 (rate limited); retrying in 1.2 s (attempt 2 of 3)"."""
    return (f"{_clip(str(event['error']), 200)}; retrying in {event['delay']:.1f} s "
            f"(attempt {event['attempt']} of {event['attempts']})")


def no_text_notice(output: Iterable[dict[str, Any]]) -> str | None:
    """The one line for a completed answer without text (None if it has text)."""
    output = list(output)
    if any(message_text(i).strip() for i in output if i.get("type", "message") == "message"):
        return None
    if any(i.get("type") == "reasoning" for i in output):
        return "(the model answered with reasoning only, no text)"
    return "(the model's answer was empty)"


def _short_id(runner_id: str) -> str:
    return neutralise(runner_id[:11]) + "…"


def _short_cause(cause: str) -> str:
    if cause.startswith("killed by "):
        return cause[len("killed by "):]
    if cause.startswith("exited with code "):
        return "exit code " + cause[len("exited with code "):]
    return neutralise(cause.split("; killed by")[0])  # "hung: no answer to pings for 4.0 s"


def transcript(items: Iterable[dict[str, Any]], style: Style) -> str:
    lines = [line for line in (render_item(i, style) for i in items) if line is not None]
    return "\n".join(lines) + "\n" if lines else ""


def session_table(rows: list[dict[str, Any]]) -> str:
    """The `/switch` table: newest first as listed, full ids."""
    if not rows:
        return "  No sessions.\n"
    table = [("#", "ID", "Title", "Status", "Created")] + [
        (str(n), neutralise(r["id"]), _clip(r.get("title") or "(untitled)", 40), neutralise(r.get("status") or ""),
         time.strftime("%b %d %H:%M", time.localtime(r.get("created_at") or 0)))
        for n, r in enumerate(rows, 1)
    ]
    widths = [max(len(row[c]) for row in table) for c in range(5)]
    lines = ["Switch to…"] + ["  " + "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip()
                             for row in table]
    return "\n".join(lines) + "\n  /switch <#> or <id> to resume\n"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return "just now"


def picker_list(rows: list[dict[str, Any]], now: float) -> str:
    """Numbered recent conversations: title, age, size, id."""
    table = [(f"{n}.", _clip(r.get("title") or "(untitled)", 40),
              age(now - (r.get("updated_at") or now)), _count(r.get("message_count", 0), "message"),
              neutralise(r["id"]))
             for n, r in enumerate(rows, 1)]
    widths = [max(len(row[c]) for row in table) for c in range(5)]
    return "".join("  " + "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() + "\n"
                   for row in table)


class Console:
    """Line-based output that keeps the input prompt intact.

    `shown_prompt` returns what the input line shows right now (prompt plus
    typed text), or None when nobody is reading. Output that arrives while it
    is shown is printed above it, whole lines only, and the line is redrawn.
    """

    def __init__(self, *, tty: bool, shown_prompt: Callable[[], str | None] = lambda: None,
                 out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.tty = tty
        self.style = Style(tty and self.out.isatty())
        self._shown_prompt = shown_prompt
        self._at_line_start = True
        self._held = ""  # late stdout text still waiting for its newline

    def write(self, text: str, *, err: bool = False) -> None:
        if not text:
            return
        prompt = self._shown_prompt()
        if prompt is None:
            if self._held:  # the prompt went away under a half-printed late line
                held, self._held = self._held, ""
                self._emit(held, False)
            self._emit(text, err)
            return
        if err:
            text += "" if text.endswith("\n") else "\n"
        else:
            text = self._held + text
            if "\n" not in text:
                self._held = text
                return
            text, _, self._held = text.rpartition("\n")
            text += "\n"
        self.out.write("\r\x1b[K")
        self._emit(text, err)
        self.out.write(prompt)
        self.out.flush()

    def _emit(self, text: str, err: bool) -> None:
        stream = self.err if err else self.out
        stream.write(text)
        stream.flush()
        if not err:
            self._at_line_start = text.endswith("\n")

    def end_line(self) -> None:
        if self._held or not self._at_line_start:
            self.write("\n")

    def line(self, text: str, *, err: bool = False) -> None:
        self.end_line()
        self.write(text + "\n", err=err)

    def notice(self, text: str) -> None:
        self.line(self.style.dim(text), err=True)

    def error(self, message: str) -> None:
        self.line(self.style.red(f"Error: {neutralise(message)}"), err=True)  # server text may quote a model

    def status(self, state: str) -> None:
        """The idle/busy status line of a terminal session (tests wait for `state: sleeping`)."""
        if self.tty:
            self.line(self.style.dim(f"state: {state}"))


class LiveRenderer:
    """Renders a session's events as they arrive, for any turn, ours or not.

    Tool steps take one line per call and one per result (`steps`); a tool's
    live output is not shown (its result line is). `interactive` says whether
    someone at a terminal can answer approvals: without one, a call refused
    for want of an answer gets the stderr line that says how to allow it.
    """

    def __init__(self, console: Console, *, interactive: bool = True) -> None:
        self.console = console
        self.interactive = interactive
        self.calls = steps.Calls()
        self._streamed: set[str] = set()  # turns whose answer arrived as text deltas
        self._shown: set[str] = set()     # turns whose answer is on screen
        self._cr = False                  # a text delta ended in CR: is it half of a CRLF?

    def event(self, event: dict[str, Any]) -> None:
        con, kind = self.console, event["type"]
        turn_id: Any = event.get("turn_id")
        call, result = steps.event_call(event), steps.event_result(event)
        if result is not None and call is not None and kind == ev.TOOL_DONE:
            # its call was shown when the model made it (live, or in the transcript on resume)
            self.calls.tools.setdefault(call[0] or "", call[1])
            self._line(self.calls.result(*result))
        elif call is not None:
            self._line(self.calls.call(*call))
        elif result is not None:
            self._line(self.calls.result(*result))
        elif kind == ev.RESPONSE_CREATED:
            self._streamed.discard(turn_id)
            self._shown.discard(turn_id)
        elif kind == ev.TEXT_DELTA:
            self._streamed.add(turn_id)
            con.write(self._delta(event["delta"]))
        elif kind == ev.ITEM_DONE:
            item = event["item"]
            if item.get("type", "message") == "message" and item.get("role") == "assistant":
                if turn_id in self._streamed:
                    con.end_line()
                    self._streamed.discard(turn_id)  # the next step's text may not stream
                else:
                    con.line(neutralise(message_text(item)))
                self._shown.add(turn_id)
            else:
                shown = render_item(item, con.style)
                if shown is not None:
                    con.line(shown)
        elif kind == ev.COMPLETED:
            con.end_line()
            output = event["response"].get("output") or ()
            notice = no_text_notice(output)
            if notice is not None:
                con.notice(notice)
            elif turn_id not in self._shown and turn_id not in self._streamed:
                con.line(neutralise(steps.final_text(list(output))))
            self._forget(turn_id)
        elif kind == ev.MODEL_RETRY:
            con.notice(retry_notice(event))
        elif kind == ev.FAILED:
            error = event["error"]
            con.error(neutralise(str(error.get("message") or error.get("code") or "the turn failed")))
            self._forget(turn_id)
        elif kind == ev.CANCELLED:
            con.notice("(cancelled)")
            self._forget(turn_id)
        elif kind == ev.RUNNER_REBOUND:
            con.notice(rebound_notice(event))
        elif kind == ev.RUNNERS_GAVE_UP:
            con.error(f"runners cannot stay up: {neutralise(event['reason'])}")
        elif kind == ev.STEP_RECOVERED:
            con.notice(steps.recovered_notice(event))
        elif kind == ev.APPROVAL_RESOLVED and event.get("decision") == "timeout":
            tool = str(event.get("tool") or self.calls.tool_of(event.get("call_id")))
            if self.interactive:
                con.notice(f"the approval of {steps.clip(tool, 40)} timed out: not approved")
            else:
                con.line(steps.not_approved_line(tool), err=True)
        # runner lost: said once, with its replacement, by the rebound notice; if none comes
        # the turn fails with the reason. Tool output deltas and usage are not shown live.

    def _line(self, text: str | None) -> None:
        if text is not None:
            self.console.line(self.console.style.dim(text))

    def _delta(self, delta: str) -> str:
        """A text delta neutralised, a CRLF split across two deltas read as one line end."""
        if self._cr:
            delta = "\r" + delta
        self._cr = delta.endswith("\r")
        return neutralise(delta[:-1] if self._cr else delta)

    def _forget(self, turn_id: str | None) -> None:
        self._cr = False
        self._streamed.discard(turn_id)
        self._shown.discard(turn_id)
