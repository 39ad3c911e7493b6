"""The bodies of `omnigent host`, `omnigent host status` and `omnigent host stop`.

Kept out of `cli.py` so the command line stays a table of options: each
function here returns the exit code and prints one line per daemon or error.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
import trio

from .env import TOOL_POLICIES


def _home() -> Path:
    return Path(os.environ.get("HOME") or Path.home())


def run_host(server_url: str, *, roots: list[str], idle_exit: float | None, foreground: bool,
             token: str | None, log_file: Path | None, permissions: str = "ask") -> int:
    """`omnigent host --server URL`: detach a daemon (default), or be it (`--foreground`, or spawned).

    `permissions` (ask | auto | deny) is the most the tools of this host's runners may do. A
    daemon that already runs keeps its own: this says so (exit 1) rather than restart it.
    """
    from ..config.tuning import tuning_from_env
    from .daemon import DaemonConfig, main
    from .daemon_client import DaemonError, ensure_daemon, find_daemon, register_host
    from . import records

    try:
        idle_timeout = tuning_from_env().runner_idle_timeout
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if permissions not in TOOL_POLICIES:
        raise click.ClickException(f"--permissions must be one of {', '.join(TOOL_POLICIES)}, not {permissions!r}")
    config = DaemonConfig(server_url=server_url, home=_home(), workspace_roots=roots, idle_exit=idle_exit,
                          log_path=log_file, idle_timeout=idle_timeout, permissions=permissions)
    paths = records.Paths.of(config.home, server_url)
    if log_file is not None:  # spawned by ensure_daemon: stdout/stderr already are this log
        return main(config, foreground_echo=False)

    async def register_if_needed() -> None:
        if records.read_identity(paths) is None:
            host_id, secret = await register_host(paths.server_url, token=token, workspace_roots=roots)
            records.write_identity(paths, host_id, secret)

    if foreground:
        try:
            trio.run(register_if_needed)
        except DaemonError as exc:
            raise click.ClickException(str(exc)) from None
        return main(config, foreground_echo=True)

    async def detach() -> int:
        running = await find_daemon(paths)
        if running is not None and running.permissions != permissions:
            click.echo(f"Error: host daemon pid {running.pid} already runs for {paths.server_url} with "
                       f"--permissions {running.permissions}, not {permissions}; stop it first "
                       f"(`omnigent host stop --server {paths.server_url}`) to change that", err=True)
            return 1
        if running is not None:
            click.echo(f"host daemon pid {running.pid} already runs for {paths.server_url} "
                       f"(host {running.host_id}, permissions {running.permissions}); "
                       f"`omnigent host stop --server {paths.server_url}` stops it")
            return 0
        info = await ensure_daemon(server_url, home=config.home, token=token, workspace_roots=roots,
                                   idle_exit=idle_exit, permissions=permissions)
        click.echo(f"host daemon pid {info.pid} for {paths.server_url} (host {info.host_id}, "
                   f"permissions {info.permissions}); log in {paths.log_dir}")
        return 0

    try:
        return trio.run(detach)
    except DaemonError as exc:
        raise click.ClickException(str(exc)) from None


def status(server_url: str | None) -> int:
    """One line per live daemon of this HOME (for `server_url` only, when given); 1 when none runs."""
    from . import control
    from .daemon_client import live_daemons
    from .records import normalize_url

    wanted = normalize_url(server_url) if server_url else None
    found = [r for r in live_daemons(_home()) if wanted is None or r.get("server_url") == wanted]
    if not found:
        click.echo(f"no host daemon runs for {wanted}" if wanted else "no host daemon runs", err=True)
        return 1

    async def describe(record: dict) -> str:
        try:
            answer = await control.request(Path(record["control_socket"]), {"op": "status"}, timeout=5.0)
        except (control.ControlError, KeyError) as exc:
            return f"pid {record.get('pid')}  {record.get('server_url')}  not answering: {exc}"
        link = "online" if answer.get("online") else "connecting"
        return (f"pid {answer['pid']}  {answer['server_url']}  host {answer['host_id']}  {link}  "
                f"runners {len(answer.get('runners') or [])}  permissions {answer.get('permissions') or 'ask'}  "
                f"log {answer.get('log_path')}")

    for record in found:
        click.echo(trio.run(describe, record))
    return 0


def stop(server_url: str | None) -> int:
    """Stop every live daemon of this HOME (for `server_url` only, when given)."""
    from . import records
    from .daemon_client import DaemonError, live_daemons, stop_daemon

    wanted = records.normalize_url(server_url) if server_url else None
    found = [r for r in live_daemons(_home()) if wanted is None or r.get("server_url") == wanted]
    if not found:
        click.echo(f"no host daemon runs for {wanted}" if wanted else "no host daemon runs", err=True)
        return 0
    code = 0
    for record in found:
        paths = records.Paths.of(_home(), record["server_url"])
        try:
            pid = trio.run(stop_daemon, paths)
        except DaemonError as exc:
            print(f"Error: {exc}", file=sys.stderr, flush=True)
            code = 1
            continue
        if pid is not None:
            click.echo(f"stopped host daemon pid {pid} ({paths.server_url})")
    return code
