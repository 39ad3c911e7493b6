"""Where the REPL's lines come from: a terminal with editing and history, or a pipe.

On a terminal, GNU readline needs a blocking `input()`. It runs in one
long-lived thread, the only thread in omnigent, which asks trio for each
prompt before it shows it and hands every line back through
`trio.from_thread`: the prompt appears only when the REPL is ready, and no
abandoned `input()` can steal a later line (stack-notes §8).

While readline waits, the terminal's interrupt character is switched off
(readline forces ISIG on, so that is the only way), and Ctrl-C reaches readline
as a key that clears the line; during a turn Ctrl-C is a SIGINT for the REPL.
While nobody reads (a turn runs, the next prompt is being drawn), the
end-of-file character is switched off instead, so a Ctrl-D typed then waits
in the line for readline rather than becoming the kernel's end-of-file mark,
which readline never sees (`_set_reading`).
A read that may be interrupted (`read(..., interrupt=True)`: the `--resume`
picker) binds Ctrl-C to a macro that ends the line with a lone `^C` instead,
so readline returns and restores the terminal itself, and `read` raises
KeyboardInterrupt: leaving is then the same as Ctrl-D, with no reader left
behind in `input()`.

An approval answer (`ask`) goes through the same thread, so no second
reader ever competes for the terminal. It is read in the terminal's own
canonical mode (the kernel echoes and edits the line) with `poll` on the
terminal and on a wake-up pipe, after discarding what was typed ahead (an
answer is given to the question on screen, never to one not yet asked), so
that, unlike `input()`, it can be dismissed: when another client answered the approval first, or the turn
ended, the trio side writes to the pipe, the thread discards what was typed
(`tcflush`) and returns. Ctrl-C stays a SIGINT there: it cancels the turn.

From a pipe, lines are split off a trio FdStream: no thread.
"""

from __future__ import annotations

import io
import os
import select
import sys
import termios
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Protocol

import trio

PROMPT = "❯ "
HISTORY_LINES = 1000
_CLEAR_LINE = r'"\C-c": kill-whole-line'
_INTERRUPT_LINE = r'"\C-c": "\C-a\C-k\C-v\C-c\C-m"'  # the line becomes a lone ^C, then Enter
_INTERRUPTED = "\x03"


class LineInput(Protocol):
    interactive: bool

    async def read(self, prompt: str, *, remember: bool = True, interrupt: bool = False) -> str:
        """The next line without its newline; EOFError at the end of input.

        `interrupt`: Ctrl-C raises KeyboardInterrupt (on a terminal) instead of clearing the line.
        """

    async def ask(self, prompt: str) -> str | None:
        """One answer typed at a terminal (None at EOF); cancelling it dismisses the prompt."""

    def shown_prompt(self) -> str | None:
        """The prompt and typed text while a line is being read, else None."""


def history_path() -> Path:
    """`<data dir>/history`: follows `OMNIGENT_DATA_DIR`, so `--no-session` keeps none."""
    from ..config.dirs import data_dir

    return data_dir() / "history"


class TtyInput:
    interactive = True

    def __init__(self, history: Path | None, fd: int = 0) -> None:
        import readline

        self._rl = readline
        self._fd = fd
        self._history = history
        self._token = trio.lowlevel.current_trio_token()
        self._asks_in, self._asks = trio.open_memory_channel[tuple[str, str]](0)  # (kind, prompt)
        self._lines_in, self._lines = trio.open_memory_channel[str | None](0)
        self._prompt: str | None = None
        self._answering = False  # the prompt shown is an `ask`, not readline's
        self._wake_r, self._wake_w = os.pipe()  # dismisses an `ask` (see module doc)
        os.set_blocking(self._wake_r, False)
        chars = termios.tcgetattr(fd)[6]
        self._intr, self._eof = chars[termios.VINTR], chars[termios.VEOF]
        self._no_char = bytes([os.fpathconf(fd, "PC_VDISABLE")])
        self._set_reading(None)  # nobody reads yet: a Ctrl-D typed ahead waits for the first prompt
        readline.set_auto_history(False)
        readline.parse_and_bind(_CLEAR_LINE)
        if history is not None:
            readline.set_history_length(HISTORY_LINES)
            from ..config.dirs import DiskError, private_dir, private_file

            try:
                private_dir(history.parent)
                private_file(history)  # 0600: what was typed; append_history_file needs it to exist
                readline.read_history_file(history)
            except (OSError, DiskError):
                self._history = None  # a read-only home must not break the REPL
        threading.Thread(target=self._serve, name="omnigent-input", daemon=True).start()

    def shown_prompt(self) -> str | None:
        prompt = self._prompt
        if prompt is None or self._answering:
            return prompt  # what is typed at an `ask` is in the kernel's line buffer, not readable
        return prompt + self._rl.get_line_buffer()

    async def ask(self, prompt: str) -> str | None:
        await self._asks_in.send(("answer", prompt))
        try:
            return await self._lines.receive()
        except trio.Cancelled:
            with trio.CancelScope(shield=True):
                try:
                    os.write(self._wake_w, b"x")
                except OSError:
                    pass
                await self._lines.receive()  # the thread's answer or its dismissal: the channel stays in step
                try:
                    os.read(self._wake_r, 64)  # a wake-up the thread had no need of
                except (BlockingIOError, OSError):
                    pass
            raise

    async def read(self, prompt: str, *, remember: bool = True, interrupt: bool = False) -> str:
        await self._asks_in.send(("interruptible" if interrupt else "line", prompt))
        line = await self._lines.receive()
        if line is None:
            raise EOFError
        if interrupt and line == _INTERRUPTED:
            raise KeyboardInterrupt
        if remember and line.strip():
            self._remember(line)
        return line

    def _remember(self, line: str) -> None:
        self._rl.add_history(line)
        if self._history is not None:
            try:
                self._rl.append_history_file(1, self._history)  # also trims it to HISTORY_LINES
            except OSError:
                pass

    def _serve(self) -> None:
        """The reader thread: one input() per prompt the REPL asks for."""
        while True:
            try:
                kind, prompt = trio.from_thread.run(self._asks.receive, trio_token=self._token)
            except (trio.Cancelled, trio.RunFinishedError):
                return
            if kind == "answer":
                answer = self._answer(prompt)
                try:
                    trio.from_thread.run(self._lines_in.send, answer, trio_token=self._token)
                except (trio.Cancelled, trio.RunFinishedError):
                    return
                continue
            self._set_reading("line")
            self._prompt = prompt
            if kind == "interruptible":
                self._rl.parse_and_bind(_INTERRUPT_LINE)
            try:
                typed: str | None = input(prompt)
            except (EOFError, OSError):
                typed = None
            finally:
                self._prompt = None
                self._set_reading(None)
                if kind == "interruptible":
                    self._rl.parse_and_bind(_CLEAR_LINE)
            line = typed
            try:
                trio.from_thread.run(self._lines_in.send, line, trio_token=self._token)
            except (trio.Cancelled, trio.RunFinishedError):
                return

    def _answer(self, prompt: str) -> str | None:
        """In the reader thread: one line in canonical mode, or None at EOF or when dismissed."""
        try:
            try:  # what was typed ahead during the turn is not an answer to a question not yet asked
                termios.tcflush(self._fd, termios.TCIFLUSH)
            except termios.error:
                pass
            self._set_reading("answer")  # Ctrl-D ends it (None), Ctrl-C stays a SIGINT
            sys.stdout.write(prompt)
            sys.stdout.flush()
            self._prompt, self._answering = prompt, True
            poller = select.poll()
            poller.register(self._fd, select.POLLIN)
            poller.register(self._wake_r, select.POLLIN)
            while True:
                ready = {fd for fd, _ in poller.poll()}
                if self._wake_r in ready:
                    try:
                        os.read(self._wake_r, 64)
                    except (BlockingIOError, OSError):
                        pass
                    try:
                        termios.tcflush(self._fd, termios.TCIFLUSH)  # what was typed at the dismissed prompt
                    except termios.error:
                        pass
                    sys.stdout.write("\n")
                    sys.stdout.flush()
                    return None
                if self._fd in ready:
                    try:
                        data = os.read(self._fd, 4096)
                    except BlockingIOError:
                        continue
                    except OSError:
                        return None
                    return data.decode("utf-8", "replace").rstrip("\r\n") if data else None
        finally:
            self._prompt, self._answering = None, False
            self._set_reading(None)

    def _set_reading(self, reading: str | None) -> None:
        """The terminal's special characters for who reads it now: readline ("line"), an `ask`
        ("answer"), or nobody (None: a turn runs, or the REPL is between two reads).

        - Interrupt (Ctrl-C) is off while readline reads (it clears the line there), on otherwise.
        - End of file (Ctrl-D) is off while nobody reads. In the terminal's canonical mode the
          kernel turns a Ctrl-D into an end-of-file mark for whoever reads next, and readline,
          which reads in its own mode, never sees one left there: a Ctrl-D typed before the
          prompt was up (just after an answer, a `/switch`) was lost. Off, it waits in the
          line as a plain character, and readline reads it as the key it is.
        """
        if not sys.stdout.isatty():
            return  # input() does not use readline then, and ^C would land in the line
        try:
            attrs = termios.tcgetattr(self._fd)
            attrs[6][termios.VINTR] = self._no_char if reading == "line" else self._intr
            attrs[6][termios.VEOF] = self._no_char if reading is None else self._eof
            termios.tcsetattr(self._fd, termios.TCSANOW, attrs)
        except termios.error:
            pass


class PipeInput:
    interactive = False

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buf = b""
        self._eof = False

    def shown_prompt(self) -> None:
        return None

    async def ask(self, prompt: str) -> str | None:
        return None  # nobody at a pipe can answer

    async def read(self, prompt: str, *, remember: bool = True, interrupt: bool = False) -> str:
        while b"\n" not in self._buf and not self._eof:
            chunk = await self._stream.receive_some(65536)
            self._buf += chunk
            self._eof = not chunk
        if not self._buf:
            raise EOFError
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode("utf-8", "replace").removesuffix("\r")


def _utf8_stdio() -> None:
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.encoding.lower().replace("-", "") != "utf8":
            stream.reconfigure(encoding="utf-8", errors="replace")


@asynccontextmanager
async def open_input(history: Path | None = None, fd: int = 0) -> AsyncIterator[LineInput]:
    """Line input from `fd`; the terminal's modes and the fd's blocking flag are restored after."""
    _utf8_stdio()
    if not os.isatty(fd):
        blocking = os.get_blocking(fd)
        stream = trio.lowlevel.FdStream(os.dup(fd))  # sets O_NONBLOCK on the shared description
        try:
            yield PipeInput(stream)
        finally:
            await stream.aclose()
            os.set_blocking(fd, blocking)
        return
    saved = termios.tcgetattr(fd)
    try:
        yield TtyInput(history, fd)
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
