"""Plays the processes that own tools, for the "no tool descendant outlives its owner" tests.

    python tool_owner.py runner WORKSPACE MODE COMMAND
        a runner: becomes a subreaper, runs COMMAND with the shell tool, then
        sweeps its orphans and exits. MODE: "end" (let the tool finish),
        "cancel" (cancel it once it printed "ready"), "hang" (after "ready",
        wait to be killed). Prints "RUNNER <pid>", "READY", "SWEPT <pids>".
    python tool_owner.py host WORKSPACE MODE COMMAND
        a host: becomes a subreaper, starts the runner above, relays its
        lines, and once it exited sweeps what it left (as host/launching.py does).

Run by path (`python tests/support/tool_owner.py ...`), with the repo on sys.path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import trio

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from omnigent.tools import ToolContext, run_tool, scrub_env, secret_values  # noqa: E402
from omnigent.tools.reaper import become_subreaper, orphaned_tools, sweep_orphans  # noqa: E402


def kinds(marker: str) -> dict[str, str]:
    """Shell snippets that each leave one child running `sleep 300.<marker><digit>` behind."""
    sleep = f"sleep 300.{marker}"
    return {
        "background": f"{sleep}1 &",
        "nohup": f"nohup {sleep}2 >/dev/null 2>&1 &",
        "setsid": f"setsid {sleep}3 >/dev/null 2>&1 </dev/null &",
        "double_fork": f"( ( exec {sleep}4 >/dev/null 2>&1 ) & ) ;",
        "daemon": f"setsid bash -c '{sleep}5 >/dev/null 2>&1 & ' </dev/null >/dev/null 2>&1 &",
        "ignores_term": f"( trap '' TERM; exec {sleep}6 >/dev/null 2>&1 ) &",
    }


def markers_alive(marker: str) -> list[int]:
    """Pids of live (not zombie) processes with an argument starting `300.<marker>`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != b"Z" and any(a.startswith(f"300.{marker}".encode()) for a in argv):
            found.append(int(name))
    return found


def say(line: str) -> None:
    print(line, flush=True)


async def runner(workspace: str, mode: str, command: str) -> None:
    assert become_subreaper()
    say(f"RUNNER {os.getpid()}")
    ready = trio.Event()

    async def on_output(text: str) -> None:
        if "ready" in text:
            ready.set()

    ctx = ToolContext(workspace, 60.0, scrub_env(os.environ), secret_values(os.environ), on_output=on_output)
    async with trio.open_nursery() as nursery:
        async def tool() -> None:
            outcome = await run_tool("shell", json.dumps({"command": command}), ctx)
            say("OUTCOME " + json.dumps([outcome.status, outcome.output]))
            nursery.cancel_scope.cancel()
        nursery.start_soon(tool)
        await ready.wait()
        say("READY")
        if mode == "cancel":
            nursery.cancel_scope.cancel()
        elif mode == "hang":
            await trio.sleep_forever()
    say("SWEPT " + json.dumps(sweep_orphans(keep=())))


def host(workspace: str, mode: str, command: str) -> None:
    assert become_subreaper()
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "runner", workspace, mode, command],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    for line in child.stdout:
        say(line.rstrip("\n"))
    child.wait()
    say("SWEPT " + json.dumps(sweep_orphans(keep=(), select=orphaned_tools(alive=()))))


def main() -> None:
    role, workspace, mode, command = sys.argv[1:5]
    if role == "runner":
        trio.run(runner, workspace, mode, command)
    else:
        host(workspace, mode, command)


if __name__ == "__main__":
    main()
