"""Where omnigent processes write their logs, and the file logging they share.

Logs of `omnigent run` and `omnigent server` live under `<data dir>/logs/`
(`$OMNIGENT_DATA_DIR`, else `$HOME/.omnigent`; `--no-session` points it at its
temporary directory), one file per process; the host daemon's stay under
`$HOME/.omnigent/logs/` (`host_logs_dir`). Old files are pruned so a daily
user does not collect thousands. Logs hold conversations' metadata, so the
folders are 0700 and the files 0600 whatever the umask.

`OMNIGENT_LOG_LEVEL` (DEBUG, INFO, WARNING, ERROR, CRITICAL or a number;
default INFO) sets how much goes into the files opened here (the tree's log
of `omnigent run` and `omnigent server`; runners write their stderr lines
whatever it says). The CLI checks it first (`log_level`): a bad value is a
one-line error there; `open_log` falls back to INFO rather than fail.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path

from .dirs import DiskError, check_free_space, data_dir, home_dir, private_dir, private_file

KEEP = 30
LEVEL_ENV = "OMNIGENT_LOG_LEVEL"
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(environ: Mapping[str, str] = os.environ) -> int:
    """The level `OMNIGENT_LOG_LEVEL` asks for (INFO when unset); ValueError, one line, if bad."""
    raw = (environ.get(LEVEL_ENV) or "").strip()
    if not raw:
        return logging.INFO
    if raw.upper() in _LEVELS:
        level: int = getattr(logging, raw.upper())
        return level
    if raw.isdigit():
        return int(raw)
    raise ValueError(f"{LEVEL_ENV} must be one of {', '.join(_LEVELS)} or a number, not {raw!r}")


def logs_dir() -> Path:
    """`<data dir>/logs`: the logs of `omnigent run` and `omnigent server`."""
    return data_dir() / "logs"


def host_logs_dir() -> Path:
    """`$HOME/.omnigent/logs`: the host daemon's logs, keyed by HOME."""
    return home_dir() / "logs"


def open_log(kind: str, root: Path | None = None) -> logging.Handler:
    """Route this process's logging to a fresh file <root>/<kind>/<kind>-<time>-<pid>.log.

    `root` defaults to `logs_dir()`. The first line is written before this
    returns, so a full disk or an unwritable folder is a `DiskError` here
    (with no file left behind), not a logging traceback later.
    Returns the handler: whoever opened it removes it (see `close_log`)."""
    folder = private_dir((root or logs_dir()) / kind, "cannot create log folder")
    check_free_space(folder, "cannot write log")
    path = folder / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    try:
        private_file(path)
        handler = _FileHandler(path, encoding="utf-8")
    except OSError as e:
        raise DiskError("cannot create log", path, e) from e
    handler.setFormatter(logging.Formatter("%(asctime)s [%(name)s] %(message)s"))
    assert handler.stream is not None  # opened now (no `delay`)
    try:
        handler.stream.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} [omnigent] {kind} log of pid {os.getpid()}\n")
        handler.stream.flush()
    except OSError as e:
        handler.close()
        path.unlink(missing_ok=True)
        raise DiskError("cannot write log", path, e) from e
    prune(folder)
    root_logger = logging.getLogger()
    root_logger.addHandler(handler)
    try:
        root_logger.setLevel(log_level())
    except ValueError:  # said by the CLI that started this process; a child keeps the default
        root_logger.setLevel(logging.INFO)
    return handler


class _FileHandler(logging.FileHandler):
    """A log file whose write errors (a disk that filled mid-run) stay out of the
    terminal: whatever else needed the disk reports the failure in one line."""

    def handleError(self, record: logging.LogRecord) -> None:
        pass


def close_log(handler: logging.Handler) -> None:
    logging.getLogger().removeHandler(handler)
    handler.close()


def prune(folder: Path) -> None:
    try:
        files = sorted(folder.glob("*.log"), key=lambda f: f.stat().st_mtime)
        for old in files[:-KEEP]:
            old.unlink(missing_ok=True)
    except OSError:
        pass  # pruning is housekeeping: never a reason to fail a run
