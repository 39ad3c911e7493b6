"""Where omnigent processes write their logs, and the file logging they share.

Logs live under `$HOME/.omnigent/logs/` (keyed by HOME, never by the config
home, so two users or two test HOMEs never mix), one file per process, and
old files are pruned so a daily user does not collect thousands.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

KEEP = 30


def logs_dir() -> Path:
    return Path(os.environ.get("HOME") or Path.home()) / ".omnigent" / "logs"


def open_log(kind: str) -> logging.Handler:
    """Route this process's logging to a fresh file logs/<kind>/<kind>-<time>-<pid>.log.

    Returns the handler: whoever opened it removes it (see `close_log`)."""
    folder = logs_dir() / kind
    folder.mkdir(parents=True, exist_ok=True)
    prune(folder)
    path = folder / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s [%(name)s] %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return handler


def close_log(handler: logging.Handler) -> None:
    logging.getLogger().removeHandler(handler)
    handler.close()


def prune(folder: Path) -> None:
    files = sorted(folder.glob("*.log"), key=lambda f: f.stat().st_mtime)
    for old in files[:-KEEP]:
        old.unlink(missing_ok=True)
