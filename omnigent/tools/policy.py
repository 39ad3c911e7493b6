"""Which tools exist, which of them change things, and how the permission modes combine.

Pure (no I/O, no trio) so the server, the store and the CLI can import it
without pulling in the tools themselves. The loop decides with these
functions whether a call needs a person's approval; the runner checks them
again against its own host's policy, so a client cannot raise its own mode.
"""

from __future__ import annotations

import json

TOOL_NAMES: tuple[str, ...] = ("shell", "read_file", "write_file", "edit_file", "list_dir", "grep")
SIDE_EFFECTING: frozenset[str] = frozenset({"shell", "write_file", "edit_file"})
MODES: tuple[str, ...] = ("deny", "ask", "auto")  # strictest first

_TARGET_KEY = {"shell": "command", "read_file": "path", "write_file": "path",
               "edit_file": "path", "list_dir": "path", "grep": "path"}


def strictest(*modes: str | None) -> str:
    """The strictest of the modes given; None (not set) is ignored, and nothing set means "ask".

    A mode that is not one of MODES counts as "deny": a typo never loosens anything.
    """
    ranks = [MODES.index(m) if m in MODES else 0 for m in modes if m is not None]
    return MODES[min(ranks)] if ranks else "ask"


def approval_target(name: str, arguments: str) -> str:
    """What an "always" approval covers: the exact command for shell, the path as given otherwise.

    "" when the arguments are not a JSON object or lack the field (nothing can match it).
    """
    key = _TARGET_KEY.get(name)
    if key is None:
        return ""
    try:
        args = json.loads(arguments)
    except (TypeError, ValueError):
        return ""
    value = args.get(key) if isinstance(args, dict) else None
    return value if isinstance(value, str) else ""


def needs_approval(name: str, mode: str) -> bool:
    """A person must say yes first: a side-effecting tool under "ask"."""
    return name in SIDE_EFFECTING and mode == "ask"


def allowed(name: str, mode: str) -> bool:
    """False for a side-effecting tool under "deny" (or an unknown mode); read-only tools always run."""
    return name not in SIDE_EFFECTING or mode in ("ask", "auto")
