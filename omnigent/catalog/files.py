"""Writing an export: a private file (0600 whatever the umask), replaced whole."""

from __future__ import annotations

import os


def write_private(path: str, text: str) -> None:
    """Write `text` to `path`, created (or truncated) with mode 0600; raises OSError."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # exact, also for a file that existed with a looser mode
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            fd = -1
            f.write(text)
    finally:
        if fd >= 0:
            os.close(fd)
