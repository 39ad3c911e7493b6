"""How conversations look in a terminal: transcripts, live events, tables.

Everything here turns data into text; `console.Console` is the one place that
writes (it is re-exported here with `Style` for the modules that import it
from here). Every text that came from the model, a tool or the store is
`neutralise`d (see `safe`) before styling is added, so it cannot drive the
terminal. An assistant's text is rendered as Markdown only when the console
says so (`Console.markdown`: a terminal, no `NO_COLOR`, no `--raw`); the
renderer is imported then and only then.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from protocol import events as ev

from ..client import message_text
from . import steps
from .safe import neutralise

if TYPE_CHECKING:
    from .console import Console, Style

__all__ = ["Console", "LiveRenderer", "Style", "age", "picker_list", "render_item", "session_table",
           "transcript"]

USER_MARK = "› "  # never the prompt glyph: tests wait for that one
TITLE_WIDTH = 40
# events that print nothing: a Markdown line still streaming is not cut by them
_QUIET = frozenset({ev.TEXT_DELTA, ev.HEARTBEAT, ev.USAGE, ev.TOOL_OUTPUT, ev.SESSION_STATUS, ev.INPUT_CONSUMED,
                    ev.RUNNER_LOST, ev.TURN_RETRIED})
# how a turn that did not complete is marked in a transcript, after its items
_ENDINGS = {"cancelled": "(cancelled)", "interrupted": "(interrupted)", "failed": "(failed)"}


def __getattr__(name: str) -> Any:
    # `Console` and `Style` are importable from here as they always were, without `-p` (which
    # imports this module for its notices) paying for the console and its status line
    if name in ("Console", "Style"):
        from . import console

        return getattr(console, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _clip(text: str, width: int) -> str:
    text = " ".join(neutralise(text).split())
    if len(text) <= width and text.isascii():
        return text
    from .table import clip

    return clip(text, width)


def markdown_renderer(console: Console) -> Callable[[str], str] | None:
    """The console's Markdown renderer of a whole message, or None when it prints text as it is."""
    if not console.markdown:
        return None
    from .markdown import render

    return render


def render_item(item: dict[str, Any], style: Style, markdown: Callable[[str], str] | None = None) -> str | None:
    """One stored or streamed item as display lines (no trailing newline), None if not shown.

    `markdown` renders an assistant's text (see `markdown_renderer`); without it the text is as it is.
    """
    kind = item.get("type", "message")
    if kind == "message":
        text = neutralise(message_text(item))
        if item.get("role") == "user":
            return style.bold(USER_MARK + text.replace("\n", "\n  "))
        if item.get("role") != "assistant":
            return None
        return markdown(text) if markdown is not None else text
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


def turn_endings(turns: Iterable[dict[str, Any]]) -> dict[str, str]:
    """{input item id: its latest turn's status} for the turns that did not complete."""
    latest: dict[str, str] = {}
    for turn in turns:  # oldest first: a retry's turn replaces the one it retried
        if turn.get("input_item_id"):
            latest[str(turn["input_item_id"])] = str(turn.get("status") or "")
    return {item: status for item, status in latest.items() if status in _ENDINGS}


def transcript(items: Iterable[dict[str, Any]], style: Style, markdown: Callable[[str], str] | None = None,
               turns: Iterable[dict[str, Any]] = ()) -> str:
    """The conversation as printed by `/history` and on resume.

    With `turns` (the session's turn rows), a message whose turn was
    cancelled, interrupted or failed is followed, after what the turn
    stored, by a dim `(cancelled)` line (or `(interrupted)`, `(failed)`).
    """
    endings = turn_endings(turns)
    lines: list[str] = []
    ending: str | None = None

    def close() -> None:
        if ending is not None:
            lines.append(style.dim("  " + _ENDINGS[ending]))

    for item in items:
        if item.get("type", "message") == "message" and item.get("role") == "user":
            close()
            ending = endings.get(str(item.get("id")))
        shown = render_item(item, style, markdown)
        if shown is not None:
            lines.append(shown)
    close()
    return "\n".join(lines) + "\n" if lines else ""


def session_table(rows: list[dict[str, Any]], max_width: int | None = None) -> str:
    """The `/switch` table: newest first as listed, full ids, titles (names)."""
    if not rows:
        return "  No sessions.\n"
    body = [(str(n), neutralise(r["id"]), _clip(r.get("title") or "(untitled)", TITLE_WIDTH),
             neutralise(r.get("status") or ""), time.strftime("%b %d %H:%M", time.localtime(r.get("created_at") or 0)))
            for n, r in enumerate(rows, 1)]
    from .table import format_table

    table = format_table(("#", "ID", "Title", "Status", "Created"), body,
                         max_width=None if max_width is None else max_width - 2)
    return "\n".join(["Switch to…", *("  " + line for line in table)]) + "\n  /switch <#> or <id> to resume\n"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return "just now"


def picker_list(rows: list[dict[str, Any]], now: float) -> str:
    """Numbered recent conversations: title, age, size, id."""
    table = [(f"{n}.", _clip(r.get("title") or "(untitled)", TITLE_WIDTH),
              age(now - (r.get("updated_at") or now)), _count(r.get("message_count", 0), "message"),
              neutralise(r["id"]))
             for n, r in enumerate(rows, 1)]
    from .table import format_table

    return "".join("  " + line + "\n" for line in format_table((), table))


class LiveRenderer:
    """Renders a session's events as they arrive, for any turn, ours or not.

    Tool steps take one line per call and one per result (`steps`); a tool's
    live output is not shown (its result line is). `interactive` says whether
    someone at a terminal can answer approvals: without one, a call refused
    for want of an answer gets the stderr line that says how to allow it.

    When the console renders Markdown, streamed text goes through one
    `markdown.MarkdownStream`: each line is shown once complete, and the
    unfinished one is shown when the message ends or something else is
    printed (a tool line, a notice).
    """

    def __init__(self, console: Console, *, interactive: bool = True) -> None:
        self.console = console
        self.interactive = interactive
        self.calls = steps.Calls()
        self.markdown = markdown_renderer(console)
        self._stream: Any = None          # the MarkdownStream of the text streaming now
        self._streamed: set[str | None] = set()  # turns whose answer arrived as text deltas
        self._shown: set[str | None] = set() # turns whose answer is on screen
        self._cr = False                  # a text delta ended in CR: is it half of a CRLF?

    def event(self, event: dict[str, Any]) -> None:
        con, kind = self.console, event["type"]
        turn_id: Any = event.get("turn_id")
        if kind not in _QUIET:
            self._settle()
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
            con.write(self._text(self._delta(event["delta"])))
        elif kind == ev.ITEM_DONE:
            item = event["item"]
            if item.get("type", "message") == "message" and item.get("role") == "assistant":
                if turn_id in self._streamed:
                    con.end_line()
                    self._streamed.discard(turn_id)  # the next step's text may not stream
                else:
                    con.line(self._whole(message_text(item)))
                self._shown.add(turn_id)
            else:
                shown = render_item(item, con.style, self.markdown)
                if shown is not None:
                    con.line(shown)
        elif kind == ev.COMPLETED:
            con.end_line()
            output = event["response"].get("output") or ()
            notice = no_text_notice(output)
            if notice is not None:
                con.notice(notice)
            elif turn_id not in self._shown and turn_id not in self._streamed:
                con.line(self._whole(steps.final_text(list(output))))
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

    def _whole(self, text: str) -> str:
        text = neutralise(text)
        return self.markdown(text) if self.markdown is not None else text

    def _text(self, text: str) -> str:
        """Streamed text as it is, or its complete lines rendered (the rest is held)."""
        if self.markdown is None:
            return text
        if self._stream is None:
            from .markdown import MarkdownStream

            self._stream = MarkdownStream()
        return self._stream.feed(text)  # type: ignore[no-any-return]

    def _settle(self) -> None:
        """Show the line still held by the Markdown stream (something else is printed next)."""
        if self._stream is not None:
            self.console.write(self._stream.flush())

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
