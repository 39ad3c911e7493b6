"""Plain log lines on stderr, which the supervisor sends to the runner's log file.

No `logging` setup: a child process writes a handful of lines (started,
connected, turn start/end, errors) and its stderr already is the log.
"""

from __future__ import annotations

import sys
import time


def log(message: str) -> None:
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
    # one write a line: print() wrote the line and its newline in two (stderr writes through)
    sys.stderr.write(f"{stamp} runner: {message}\n")
    sys.stderr.flush()


def one_line(text: object, limit: int = 500) -> str:
    """Collapse whitespace so an error message fits one log line and one frame field."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
