"""The built-in tools an agent may call: shell, read_file, write_file, edit_file, list_dir, grep.

Imported by the runner only; `omnigent.tools.policy` (which tools exist,
which change things, how modes combine) is pure and importable anywhere.

`run_tool` never raises for the model's mistakes (bad JSON, an unknown tool,
a path outside the workspace, a failed edit): those come back as status
"error" with one line the model can act on. The file tools are confined to
the workspace (see `paths`); `shell` is not, and says so. The file tools do
blocking I/O in a worker thread (`trio.to_thread.run_sync`): the read-only
ones are abandoned on a cancel (grep also stops at its next file), the
writes (at most 1 MiB) are waited for, so a cancelled write either happened
or did not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .definitions import definitions
from .environment import redact, scrub_env, secret_values

if TYPE_CHECKING:
    from .calls import ToolContext, ToolOutcome, preview, run_tool, running_tool_pids

__all__ = ["ToolContext", "ToolOutcome", "definitions", "preview", "redact", "run_tool",
           "running_tool_pids", "scrub_env", "secret_values"]

_LAZY = frozenset({"ToolContext", "ToolOutcome", "preview", "run_tool", "running_tool_pids"})


def __getattr__(name: str) -> object:
    # trio and the tools themselves load on first use: importing `omnigent.tools.policy`
    # (which runs this file) stays cheap for the server and the CLI
    if name in _LAZY:
        from . import calls
        return getattr(calls, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
