"""Where the store lives on disk.

Read at call time, not import time, so tests and `--no-session` can point
`OMNIGENT_DATA_DIR` elsewhere after import.
"""

from __future__ import annotations

import os
from pathlib import Path

DB_FILENAME = "chat.db"


def default_data_dir() -> Path:
    """`$OMNIGENT_DATA_DIR`, else `$HOME/.omnigent`."""
    configured = os.environ.get("OMNIGENT_DATA_DIR")
    if configured:
        return Path(configured).expanduser()
    home = os.environ.get("HOME")
    return (Path(home) if home else Path.home()) / ".omnigent"


def default_db_path() -> Path:
    """The persistent store file: `default_data_dir() / "chat.db"`."""
    return default_data_dir() / DB_FILENAME
