"""The `OMNIGENT_SESSIONS_ADAPTER_DEBUG` trace: what the REPL does to a session, on stderr.

The original printed these lines and e2e tests parse them (ids quoted with
repr, reference §2.4), so their wording is a contract, not a log format.
"""

from __future__ import annotations

import os
import sys


def trace(line: str) -> None:
    if os.environ.get("OMNIGENT_SESSIONS_ADAPTER_DEBUG"):
        print(f"[sessions-adapter] {line}", file=sys.stderr, flush=True)
