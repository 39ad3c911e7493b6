"""What the model is told about each tool: a name, a description that states the caps, and
a JSON-schema of its arguments.

The neutral form `{"name", "description", "parameters"}`; the runner wraps it for the
Responses or the chat wire. Deterministic (same names, same dicts in the same key order)
so a repeated model request is byte-identical to the interrupted one.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from .policy import TOOL_NAMES

READ_MAX_BYTES = 256 * 1024
READ_MAX_LINES = 2000
WRITE_MAX_BYTES = 1024 * 1024
GREP_MAX_MATCHES = 500
LIST_MAX_ENTRIES = 1000
SHELL_KEEP_HEAD = 32 * 1024
SHELL_KEEP_TAIL = 32 * 1024


def _object(properties: dict, required: list[str]) -> dict:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


_PATH = {"type": "string", "description": "A path inside the workspace, relative to it (or absolute inside it)."}

_TOOLS: dict[str, dict] = {
    "shell": {
        "description": (
            "Run a command with `bash -c` in the session's workspace directory. The command is NOT "
            "confined to the workspace: it runs as the user and can reach anything the user can. "
            "stdin is empty; stdout and stderr are combined. Output over 64 KiB is cut to its first "
            "and last 32 KiB (the cut is marked). The exit code is reported on the last line. "
            "Anything it leaves running in the background is killed when it ends, and everything "
            "it started is killed when it exceeds its timeout."),
        "parameters": _object({
            "command": {"type": "string", "description": "The bash command line to run."},
            "timeout_s": {"type": "number", "description": "Seconds before the command is killed (default: the agent's tool timeout)."},
        }, ["command"]),
    },
    "read_file": {
        "description": (
            "Read a text file inside the workspace; each line is prefixed with its line number. "
            "At most 2,000 lines or 256 KiB per call: use offset and limit to read further. "
            "Paths outside the workspace and symbolic links are refused."),
        "parameters": _object({
            "path": _PATH,
            "offset": {"type": "integer", "description": "First line to show, counting from 1 (default 1)."},
            "limit": {"type": "integer", "description": "How many lines to show (default and maximum 2000)."},
        }, ["path"]),
    },
    "write_file": {
        "description": (
            "Create a file inside the workspace, or replace its whole content. Missing parent "
            "directories are created. At most 1 MiB. Paths outside the workspace and symbolic links "
            "are refused."),
        "parameters": _object({
            "path": _PATH,
            "content": {"type": "string", "description": "The complete new content of the file."},
        }, ["path", "content"]),
    },
    "edit_file": {
        "description": (
            "Replace one exact piece of text in a file inside the workspace. old_string must occur "
            "exactly once in the file (include enough surrounding lines to make it unique); otherwise "
            "nothing is changed and you are told how many times it matched. Files up to 1 MiB. "
            "Paths outside the workspace and symbolic links are refused."),
        "parameters": _object({
            "path": _PATH,
            "old_string": {"type": "string", "description": "The exact text to replace (whitespace included)."},
            "new_string": {"type": "string", "description": "The text to put in its place."},
        }, ["path", "old_string", "new_string"]),
    },
    "list_dir": {
        "description": (
            "List a directory inside the workspace: one entry per line with its type (dir, file "
            "with size, symlink with its target, which is not followed). At most 1,000 entries."),
        "parameters": _object({
            "path": {"type": "string", "description": "A directory inside the workspace (default: the workspace itself)."},
        }, []),
    },
    "grep": {
        "description": (
            "Search files inside the workspace for a Python regular expression; prints "
            "path:line:text for each matching line, at most 500 matches. Skips binary files, "
            ".git directories and symbolic links (never followed)."),
        "parameters": _object({
            "pattern": {"type": "string", "description": "A Python `re` regular expression."},
            "path": {"type": "string", "description": "A file or directory to search (default: the whole workspace)."},
            "glob": {"type": "string", "description": "Only files whose name (or path relative to the search root) matches this glob, e.g. *.py."},
        }, ["pattern"]),
    },
}


def definitions(names: Sequence[str]) -> list[dict]:
    """The definitions of `names`, in the canonical order of TOOL_NAMES; unknown names are skipped."""
    wanted = set(names)
    return [{"name": name, "description": _TOOLS[name]["description"],
             "parameters": copy.deepcopy(_TOOLS[name]["parameters"])}
            for name in TOOL_NAMES if name in wanted]
