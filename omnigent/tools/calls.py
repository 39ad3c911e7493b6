"""One tool call: the context it runs in, its outcome, and the dispatch to the tool.

See the package docstring for what is guaranteed. Imported lazily by the
package (`omnigent.tools.run_tool` and friends), so `omnigent.tools.policy`
stays cheap for the server and the CLI.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import trio

from . import files, search
from .environment import redact, scrub_env, secret_values
from .files import ToolError
from .paths import PathError, Workspace
from .policy import TOOL_NAMES
from .shell import run_shell, running_tool_pids  # noqa: F401  (re-exported by the package)

MAX_CALL_TIMEOUT = 600.0  # a call may ask for longer than the agent's default, up to this (or the default)


@dataclass
class ToolContext:
    workspace: str                       # absolute, the session's workspace
    timeout_s: float
    env: Mapping[str, str]               # already scrubbed (scrub_env)
    secrets: Sequence[str]               # values to redact from output
    on_output: Callable[[str], Awaitable[None]] | None = None   # streamed chunks (already redacted)
    captured: list[str] = field(default_factory=list)           # every chunk so far, for a cancel


@dataclass(frozen=True)
class ToolOutcome:
    status: str          # as ToolResult: completed | error | timeout (cancelled is raised, not returned)
    output: str
    exit_code: int | None = None


def _parse(name: str, arguments: str) -> dict:
    try:
        args = json.loads(arguments or "{}")
    except (TypeError, ValueError) as exc:
        raise ToolError(f"the arguments of {name} are not valid JSON: {exc}") from None
    if not isinstance(args, dict):
        raise ToolError(f"the arguments of {name} must be a JSON object")
    return args


def _timeout(args: dict, default: float) -> float:
    value = args.get("timeout_s")
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ToolError("timeout_s must be a positive number of seconds")
    return min(float(value), max(default, MAX_CALL_TIMEOUT))


async def run_tool(name: str, arguments: str, ctx: ToolContext) -> ToolOutcome:
    """Run one call; see the package docstring. On trio.Cancelled the tool is stopped and
    Cancelled goes out; `ctx.captured` then holds the output so far."""
    try:
        if name not in TOOL_NAMES:
            raise ToolError(f"unknown tool {name!r}; the tools are: {', '.join(TOOL_NAMES)}")
        args = _parse(name, arguments)
        if name == "shell":
            command = files._string(args, "command")
            status, output, code = await run_shell(
                command, workspace=ctx.workspace, env=scrub_env(ctx.env), timeout_s=_timeout(args, ctx.timeout_s),
                secrets=ctx.secrets, captured=ctx.captured, on_output=ctx.on_output)
            return ToolOutcome(status, output, code)
        with trio.move_on_after(ctx.timeout_s) as timer:  # a grep of a huge tree, a slow disk
            output = await _in_thread(name, Workspace(ctx.workspace), args)
        if timer.cancelled_caught:
            output = f"{name} timed out after {ctx.timeout_s:g} s"
            ctx.captured.append(output)
            return ToolOutcome("timeout", output)
    except (ToolError, PathError) as exc:
        output = redact(str(exc), ctx.secrets)
        ctx.captured.append(output)
        return ToolOutcome("error", output)
    output = redact(output, ctx.secrets)
    ctx.captured.append(output)
    return ToolOutcome("completed", output)


async def _in_thread(name: str, ws: Workspace, args: dict) -> str:
    tool = {"read_file": files.read_file, "write_file": files.write_file, "edit_file": files.edit_file,
            "list_dir": files.list_dir, "grep": search.grep}[name]
    if name in ("write_file", "edit_file"):
        return await trio.to_thread.run_sync(tool, ws, args)
    stop = threading.Event()  # grep checks it between files, so an abandoned walk ends soon
    try:
        if name == "grep":
            return await trio.to_thread.run_sync(lambda: search.grep(ws, args, stop=stop), abandon_on_cancel=True)
        return await trio.to_thread.run_sync(tool, ws, args, abandon_on_cancel=True)
    finally:
        stop.set()


async def preview(name: str, arguments: str, workspace: str, *, secrets: Sequence[str] | None = None) -> str:
    """The unified diff write_file or edit_file would make ("" if none, or if the call would fail).

    Redacted like tool output: `secrets` defaults to this process's own (`secret_values(os.environ)`).
    """
    if name not in ("write_file", "edit_file"):
        return ""
    try:
        args = _parse(name, arguments)
        diff = await trio.to_thread.run_sync(files.preview, Workspace(workspace), name, args,
                                             abandon_on_cancel=True)
    except (ToolError, PathError):
        return ""
    return redact(diff, secret_values(os.environ) if secrets is None else secrets)
