"""The one place the REPL writes to the terminal: lines, the input prompt kept intact, the status line.

Everything the REPL prints goes through `Console`, so it alone knows what
is on the screen's last lines and redraws them:

- While input is read, the prompt line (`❯ ` and what is typed) is the
  cursor's line and the status line (`state: sleeping`) is the line below
  it. Output that arrives meanwhile (another client's turn, a notice) is
  printed above the prompt, whole lines only, and both are drawn again: `❯ `
  is written as literal contiguous bytes each time, since it is the signal
  that the REPL reads.
- While a turn runs, the status line (`state: running · 4 s · 812 tokens`)
  is the last line, under the answer; each write erases it first and draws
  it again after, and `tick` redraws it in place as time passes. It is never
  appended: the scrollback keeps the answer, not the states.
- The status line exists only on a terminal (stdin and stdout both, and not
  `TERM=dumb`): piped output has none at all.

`NO_COLOR` (any value) turns styling off; Markdown rendering (`markdown`) is
on only on such a terminal, without `NO_COLOR` and without `run --raw`.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Mapping
from typing import TextIO

from .safe import neutralise
from .status import Status
from .table import clip, display_width

_ERASE_LINE = "\r\x1b[K"
_ERASE_BELOW = "\r\x1b[J"
_UP = "\x1b[1A"


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


def terminal_out(out: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """`out` is a terminal that takes cursor movement (not `TERM=dumb`)."""
    env = os.environ if environ is None else environ
    try:
        return out.isatty() and env.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):
        return False


def no_color(environ: Mapping[str, str] | None = None) -> bool:
    """https://no-color.org: set (to anything but empty) means no styling."""
    return bool((os.environ if environ is None else environ).get("NO_COLOR"))


class Console:
    """Line-based output that keeps the input prompt and the status line intact.

    `shown_prompt` returns what the input line shows right now (prompt plus
    typed text), or None when nobody is reading. `screen` (default: `tty`
    and stdout a terminal) says whether the status line is drawn; `markdown`
    asks for rendered answers, granted only on such a screen without
    `NO_COLOR`. `clock` is the trio clock (tests pass their own).
    """

    def __init__(self, *, tty: bool, shown_prompt: Callable[[], str | None] = lambda: None,
                 out: TextIO | None = None, err: TextIO | None = None, markdown: bool = False,
                 screen: bool | None = None, clock: Callable[[], float] | None = None) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.tty = tty
        self.screen = tty and terminal_out(self.out) if screen is None else screen
        plain = no_color()
        self.style = Style(self.screen and not plain)
        self.markdown = markdown and self.screen and not plain
        self.status = Status()
        self._clock = clock
        self._shown_prompt = shown_prompt
        self._at_line_start = True
        self._held = ""        # late stdout text still waiting for its newline
        self._footer = False   # the running status is drawn on the cursor's line
        self._below = False    # the sleeping status is drawn on the line below the prompt

    # --- writing --------------------------------------------------------------

    def write(self, text: str, *, err: bool = False) -> None:
        if not text:
            return
        prompt = self._shown_prompt()
        if prompt is None:
            self._clear_footer()
            below, self._below = self._below, False
            if below:  # about to read, the prompt not drawn yet: the status goes below this text
                self.out.write(_ERASE_BELOW)
                self.out.flush()
            if self._held:  # the prompt went away under a half-printed late line
                held, self._held = self._held, ""
                self._emit(held, False)
            self._emit(text, err)
            if below and self._at_line_start:
                self._draw_below()
                self.out.flush()
            self._draw_footer()
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
        self.out.write(_ERASE_BELOW if self._below else _ERASE_LINE)
        self.out.flush()
        self._emit(text, err)
        if self._below:
            self._draw_below()
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

    # --- the status line --------------------------------------------------------

    def _now(self) -> float:
        if self._clock is not None:
            return self._clock()
        import trio

        return trio.current_time()

    def _columns(self) -> int:
        return shutil.get_terminal_size().columns

    def _status_text(self) -> str:
        # one row at most: a status line that wrapped could not be erased by `\r\x1b[K`
        return self.style.dim(clip(self.status.text(self._now()), self._columns() - 1))

    def _draw_footer(self) -> None:
        if (self.screen and self.status.running and not self._footer and self._at_line_start
                and self._shown_prompt() is None):
            self.out.write(self._status_text())
            self.out.flush()
            self._footer = True

    def _clear_footer(self) -> None:
        if self._footer:
            self.out.write(_ERASE_LINE)
            self.out.flush()  # before anything goes to stderr
            self._footer = False

    def _draw_below(self) -> None:
        # from the start of an empty line: the status on the next line, the cursor back here
        self.out.write(f"\n{self._status_text()}\x1b[K{_UP}\r")
        self._below = True

    def turn_started(self) -> None:
        """A turn of ours runs: `state: running`, with its time and tokens, under the output."""
        self.status.start(self._now())
        if self.screen:
            self.end_line()
            self._draw_footer()

    def turn_ended(self) -> None:
        self.status.stop(self._now())
        if self._footer:
            self.out.write(_ERASE_LINE)
            self.out.flush()
            self._footer = False

    def tokens(self, total: int | None) -> None:
        """The running turn's tokens so far."""
        if total is not None and self.status.running:
            self.status.tokens = total
            self.tick()

    def tick(self) -> None:
        """Redraw the running status in place (its elapsed time)."""
        if self._footer:
            self.out.write(_ERASE_LINE + self._status_text())
            self.out.flush()

    def interrupted(self) -> None:
        """Ctrl-C was echoed as `^C` where the cursor is: the next line starts clean."""
        if self._footer:
            self.out.write(_ERASE_LINE)  # the status line, ^C and all; drawn again by the next write
            self._footer = False
            self._draw_footer()
        elif self.tty:
            self.write("\n")

    def before_read(self, *, sleeping: bool = True) -> None:
        """Input is about to be read: the cursor goes to the start of a clean line for the prompt.

        `sleeping`: the REPL's own prompt, with `state: sleeping` below it (an
        approval's question has none: a turn is still running).
        """
        self.end_line()
        self._clear_footer()
        if self.screen and sleeping:
            self._draw_below()
        self.out.flush()

    def after_read(self, *, eof: bool = False, shown: str | None = None) -> None:
        """The line was read: the cursor is on the line the status was (Enter moved it there).

        `eof`: Ctrl-D, which moves nowhere: the newline is written here.
        `shown`: the prompt and the line as typed. When it took two rows,
        readline wrote its second row over the status line without knowing it
        was there, so the status's tail is erased there too.
        """
        if eof and self.tty:
            self.out.write("\n")
        if self._below:
            self.out.write(_ERASE_LINE)
            self._below = False
            columns = self._columns()
            width = display_width(shown) if shown is not None else 0
            if columns < width < 2 * columns:
                self.out.write(f"{_UP}\r\x1b[{width - columns}C\x1b[K\n")
        self._at_line_start = True
        self.out.flush()
        self._draw_footer()
