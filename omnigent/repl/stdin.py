"""Stdin as context for `omnigent run -p` (`git diff | omnigent run reviewer.yaml -p "review this"`).

The rules, so a script gets what it piped and a harness is never stuck:
- only a pipe or a regular file is read. A terminal is never read (the
  user did not mean to type context), nor `/dev/null` or any other
  character device, socket or closed fd;
- a pipe is waited on for its first byte or its EOF at most
  `OMNIGENT_STDIN_TIMEOUT` seconds (2 s) after the run started; when neither
  comes (a test harness, the seeds among them, leaves an idle inherited
  pipe), `-p` goes on without it and says so in one stderr line. Once a
  byte came, it is read to EOF, however slow the writer (`git diff` of a
  big tree);
- empty stdin (or only whitespace) adds nothing;
- the context and the prompt form one user message: the context in a fenced
  block, then the prompt (`compose`). It is bounded (`MAX_CONTEXT`): a
  message is one JSON request of at most 1 MiB, so more is a one-line error,
  not a truncated review;
- `-p -` reads the prompt itself from stdin (`read_prompt`), with no timeout.

Bytes that are not UTF-8 are replaced (U+FFFD): the model is sent text.
"""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass

import trio

ENV_VAR = "OMNIGENT_STDIN_TIMEOUT"
DEFAULT_TIMEOUT = 2.0
MAX_CONTEXT = 768 * 1024  # bytes of stdin sent as context (the message body is bounded at 1 MiB)
_CHUNK = 65536


class StdinError(Exception):
    """Stdin cannot be used as asked: one line, exit 1."""


def timeout_from_env(environ: dict[str, str] | None = None) -> float:
    raw = (os.environ if environ is None else environ).get(ENV_VAR, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        raise StdinError(f"{ENV_VAR}={raw!r}: expected a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise StdinError(f"{ENV_VAR}={raw!r}: expected a number of seconds >= 0")
    return value


def kind(fd: int = 0) -> str | None:
    """"pipe" or "file" when `fd` may be read as context, else None (terminal, /dev/null, socket, closed)."""
    try:
        if os.isatty(fd):
            return None
        mode = os.fstat(fd).st_mode
    except OSError:
        return None
    if stat.S_ISFIFO(mode):
        return "pipe"
    if stat.S_ISREG(mode):
        return "file"
    return None


def waited_note(timeout: float) -> str:
    return (f"omnigent: nothing arrived on stdin within {timeout:g} s; going on without it "
            f"(give </dev/null to skip the wait)")


def fence_for(text: str) -> str:
    """A backtick fence longer than any backtick run in `text`, so the block cannot be closed early."""
    longest = run = 0
    for char in text:
        run = run + 1 if char == "`" else 0
        longest = max(longest, run)
    return "`" * max(3, longest + 1)


def compose(context: str | None, prompt: str) -> str:
    """The one user message: the context fenced, a blank line, then the prompt."""
    if context is None or not context.strip():
        return prompt
    fence = fence_for(context)
    body = context if context.endswith("\n") else context + "\n"
    return f"{fence}\n{body}{fence}\n\n{prompt}"


def _decode(data: bytes) -> str | None:
    if len(data) > MAX_CONTEXT:
        raise StdinError(f"stdin holds more than {MAX_CONTEXT // 1024} KiB, more than one message can "
                         f"carry; pipe less of it (e.g. through head -c {MAX_CONTEXT})")
    text = data.decode("utf-8", "replace")
    return text if text.strip() else None


@dataclass
class StdinContext:
    """Stdin to be read as context once the front end needs it.

    `started` is the trio time the run started (set by the CLI as the tree
    starts), so the wait overlaps the tree's start-up: data or EOF that came
    meanwhile is already in the pipe.
    """

    fd: int = 0
    timeout: float = DEFAULT_TIMEOUT
    started: float | None = None

    async def read(self) -> tuple[str | None, str | None]:
        """(context text or None, a stderr note or None)."""
        what = kind(self.fd)
        if what is None:
            return None, None
        if what == "file":
            return _decode(_read_file(self.fd)), None
        deadline = (self.started if self.started is not None else trio.current_time()) + self.timeout
        return await _read_pipe(self.fd, deadline, self.timeout)


def _read_file(fd: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size <= MAX_CONTEXT:
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


async def _read_pipe(fd: int, deadline: float, timeout: float) -> tuple[str | None, str | None]:
    blocking = os.get_blocking(fd)
    stream = trio.lowlevel.FdStream(os.dup(fd))  # O_NONBLOCK on the shared description, restored below
    try:
        first = b""
        with trio.move_on_at(deadline):
            first = await stream.receive_some(_CHUNK)
            if not first:
                return None, None  # EOF: empty stdin adds nothing
        if not first:
            # a slow start-up (a loaded machine) may have spent the whole wait before this ran:
            # what is in the pipe already still counts (the cancelled receive never looked)
            try:
                first = os.read(fd, _CHUNK)  # non-blocking: O_NONBLOCK is on the shared description
            except BlockingIOError:
                return None, waited_note(timeout)
            if not first:
                return None, None
        chunks, size = [first], len(first)
        while size <= MAX_CONTEXT:
            chunk = await stream.receive_some(_CHUNK)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return _decode(b"".join(chunks)), None
    finally:
        await stream.aclose()
        try:
            os.set_blocking(fd, blocking)
        except OSError:
            pass


def read_prompt(fd: int = 0) -> str:
    """`-p -`: the whole of stdin (terminal included, until Ctrl-D), no timeout; StdinError if unusable."""
    try:
        if fd == 0 and sys.stdin is not None and sys.stdin.buffer is not None:
            data = sys.stdin.buffer.read(MAX_CONTEXT + 1)
        else:
            chunks: list[bytes] = []
            while sum(map(len, chunks)) <= MAX_CONTEXT and (chunk := os.read(fd, _CHUNK)):
                chunks.append(chunk)
            data = b"".join(chunks)
    except (OSError, ValueError, AttributeError) as exc:
        raise StdinError(f"-p -: cannot read the prompt from stdin: {exc}") from None
    if len(data) > MAX_CONTEXT:
        raise StdinError(f"-p -: the prompt on stdin is longer than {MAX_CONTEXT // 1024} KiB")
    return data.decode("utf-8", "replace").rstrip("\r\n")  # `echo` adds one; the model needs none
