"""Where the store lives on disk: `chat.db` in the data dir (see `omnigent.config.dirs`).

Read at call time, not import time, so tests and `--no-session` can point
`OMNIGENT_DATA_DIR` elsewhere after import.
"""

from __future__ import annotations

from pathlib import Path

from ..config.dirs import data_dir

DB_FILENAME = "chat.db"


def default_data_dir() -> Path:
    """`$OMNIGENT_DATA_DIR`, else `$HOME/.omnigent`."""
    return data_dir()


def default_db_path() -> Path:
    """The persistent store file: `default_data_dir() / "chat.db"`."""
    return default_data_dir() / DB_FILENAME
