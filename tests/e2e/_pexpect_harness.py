"""Driving the REPL under a real PTY, as the original's pexpect harness did.

The readiness markers are the seeds': `state: sleeping` is the status line
the REPL draws (in place, on the line below the prompt) each time it starts
reading input, and `❯ ` the prompt itself; `state: running` is the status
line while a turn runs. `screen_lines` replays what the PTY received as a
terminal would show it, to check what stays in the scrollback.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pexpect

STATE_SLEEPING = r"state: sleeping"
PROMPT_READY = r"❯ "


def submit_prompt(child: pexpect.spawn, text: str) -> None:
    child.send(text)
    child.send("\r")


def clean_exit(child: pexpect.spawn, timeout: float) -> None:
    child.sendcontrol("d")
    try:
        child.expect(pexpect.EOF, timeout=timeout)
        return
    except pexpect.TIMEOUT:
        pass
    child.send("\x15")
    child.send("/quit\r")
    child.expect(pexpect.EOF, timeout=timeout)


def ensure_repl_test_theme_env(env: dict[str, str]) -> dict[str, str]:
    home = Path(env["HOME"])
    if home != Path(os.path.expanduser("~")):
        config = home / ".omnigent" / "config.yaml"
        if not config.exists():
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text("# Omnigent user configuration\ntui:\n  theme: light\n")
    return env


STATE_RUNNING = r"state: running"
_CSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")


def screen_lines(stream: str) -> list[str]:
    """The lines a terminal would show (scrollback included) after `stream`, styles dropped.

    Just enough of a terminal for what the REPL and readline write here:
    printable text, CR, LF, backspace, erase to the end of the line (`K`) or
    of the screen (`J`), cursor up (`A`); other escape sequences are ignored.
    No wrapping: a line is as long as what was written on it.
    """
    lines: list[list[str]] = [[]]
    row = col = 0
    i = 0
    while i < len(stream):
        char = stream[i]
        if char == "\x1b":
            match = _CSI.match(stream, i)
            if match is None:
                i += 2  # a two-character escape (ESC 7, ESC =): nothing to draw
                continue
            arg, op = match.groups()
            if op == "K":
                del lines[row][col:]
            elif op == "J":
                del lines[row][col:]
                del lines[row + 1:]
            elif op == "A":
                row = max(0, row - int(arg or 1))
            i = match.end()
            continue
        if char == "\r":
            col = 0
        elif char == "\n":
            row += 1
            if row == len(lines):
                lines.append([])
        elif char == "\b":
            col = max(0, col - 1)
        elif char >= " ":
            line = lines[row]
            line.extend(" " * (col - len(line)))
            if col < len(line):
                line[col] = char
            else:
                line.append(char)
            col += 1
        i += 1
    return ["".join(line).rstrip() for line in lines]
