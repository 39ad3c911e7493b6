"""The `omnigent` command line: the group, its commands' options, and `main`.

Only click is imported at module level; everything heavy is imported by the
command that needs it, so `omnigent --help` and error paths stay instant.
What `run` does once its options are parsed is `omnigent.launch`; the
`config` group is `omnigent.config.commands`. The underscored helpers here
(`_bundle`, `_start_cli_runner_process`, `_stop_cli_runner_process`) are the
original's names, imported by the seeds: they stay in this module.
"""

from __future__ import annotations

from .config.timeline import mark

mark("cli.start")  # before click: the timeline's first point of a run

import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import click  # noqa: E402

from .catalog.commands import sessions as _sessions  # noqa: E402  (only click: --help stays instant)
from .config.commands import config as _config_group  # noqa: E402


def _check_server_url(url: str) -> str:
    """An http(s) URL with a host, without its trailing slash (one ClickException line if not)."""
    from .launch import check_server_url

    return check_server_url(url)


def _bundle(source: Path) -> bytes:
    """The agent bundle for a YAML file, a directory or an existing archive (kept for the seeds)."""
    from .agents import bundle_bytes

    return bundle_bytes(Path(source))


def _start_cli_runner_process(*, server_url: str, tunnel_token: str | None = None, runner_id: str | None = None,
                              workspace_cwd, capture_logs: bool, log_dir, prewarm_spec_path,
                              isolate_session: bool = False, extra_env=None):
    """Register an explicit runner with `server_url` and start it (the original's helper).

    Returns a `CliRunnerProcess(proc, runner_id, tunnel_token, log_path)`; see
    `omnigent.tree.cli_runner`. Given `runner_id` and `tunnel_token`, exactly
    those are registered, or it fails (ClickException) when the id is known.
    """
    from .tree.cli_runner import start

    return start(server_url=server_url, tunnel_token=tunnel_token, runner_id=runner_id,
                 workspace_cwd=workspace_cwd, capture_logs=capture_logs, log_dir=log_dir,
                 prewarm_spec_path=prewarm_spec_path, isolate_session=isolate_session, extra_env=extra_env)


def _stop_cli_runner_process(proc, *, grace_timeout: float = 5.0) -> int:
    """Stop a runner from `_start_cli_runner_process`: stdin EOF, SIGTERM, a grace, SIGKILL."""
    from .tree.cli_runner import stop

    return stop(proc, grace_timeout=grace_timeout)


def _version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        number = version("omnigent")
    except PackageNotFoundError:  # run from a source tree that was never installed
        number = "unknown"
    click.echo(f"omnigent {number}")
    ctx.exit(0)


def _verbose(ctx: click.Context) -> bool:
    """`-v` given to this command or to `omnigent` itself."""
    return any(c.params.get("verbose") for c in (ctx, ctx.find_root()))


@click.group(invoke_without_command=True, no_args_is_help=False,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_version,
              help="Print `omnigent <version>` and exit.")
@click.option("-v", "--verbose", is_flag=True, help="Say more on stderr (config warnings, ids).")
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """Run AI agents defined in YAML, supervised and self-healing.

    Settings: the config file ($OMNIGENT_CONFIG_HOME/config.yaml, else
    ~/.omnigent/config.yaml; see `omnigent config list`), OMNIGENT_LOG_LEVEL
    for the log files, OPENAI_API_KEY/OPENAI_BASE_URL for the model endpoint.
    """
    if ctx.invoked_subcommand is None:  # a bare `omnigent`: the help, and success (click says 2)
        click.echo(ctx.get_help())
        ctx.exit(0)
    from .config.logs import log_level

    try:
        log_level()  # every process of a run reads it; a bad value is said here, once
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


@cli.command(epilog="The model endpoint is OPENAI_BASE_URL (any OpenAI-compatible server; default "
                    "OpenAI's) with the key OPENAI_API_KEY, unless the agent's executor.auth names "
                    "others. OMNIGENT_MODEL and OMNIGENT_HARNESS override the agent file; the config "
                    "file's model and harness fill in what it leaves out.")
@click.argument("agent", required=False, type=click.Path(path_type=Path))
@click.option("--model", help="Model name, passed to the endpoint exactly as given.")
@click.option("--harness", help="openai-agents (Responses API) or openai-chat (Chat Completions).")
@click.option("--system-prompt", help="Replace the agent's prompt.")
@click.option("-p", "--prompt", help="Run this one prompt, print the answer and exit.")
@click.option("-r", "--resume", "resume", is_flag=False, flag_value="__resume_picker__", default=None,
              help="Resume a conversation by id (no id: pick from a list).")
@click.option("-c", "--continue", "resume_latest", is_flag=True,
              help="Continue the most recent conversation of this agent.")
@click.option("--no-session", is_flag=True,
              help="Keep nothing: store, logs and input history go to a temporary directory removed at exit.")
@click.option("--log/--no-log", default=False, hidden=True, help="Accepted for compatibility; does nothing.")
@click.option("--server", "server_url", metavar="URL",
              help="Use the omnigent server at URL; runners come from this HOME's host daemon for it.")
@click.option("--token", envvar="OMNIGENT_REMOTE_AUTH_TOKEN", metavar="TOKEN",
              help="Bearer token for --server (default: $OMNIGENT_REMOTE_AUTH_TOKEN).")
@click.option("--permission-mode", type=click.Choice(["ask", "auto", "deny"]), default=None,
              help="Side-effecting tools (shell, write_file, edit_file): ask first, run, or refuse. "
                   "Overrides the agent's `permissions`; the config file's `permissions` and, with "
                   "--server, the host's `omnigent host --permissions` still cap it.")
@click.option("--output-format", type=click.Choice(["text", "json", "stream-json"]), default=None,
              help="With -p: the answer as text, one JSON object, or JSON lines as it happens.")
@click.option("--raw", is_flag=True, help="Print answers as the model wrote them (no Markdown rendering).")
@click.option("--fork", "fork", metavar="ID", help="Copy conversation ID and open the REPL on the copy (ID stays as it was).")
@click.option("--name", "title", metavar="NAME", help="Name the conversation this run creates (or the fork).")
@click.option("-v", "--verbose", is_flag=True, help="Say more on stderr (with -p: the conversation id).")
@click.pass_context
def run(ctx: click.Context, agent: Path | None, log: bool, **options: Any) -> None:
    """Chat with AGENT (a YAML file or directory) in a REPL, or answer one prompt with -p.

    Without AGENT, the config file's default_agent. With -p, stdin that is
    a pipe or a file is sent too, as context before the prompt
    (`git diff | omnigent run reviewer.yaml -p "review this"`); `-p -`
    reads the prompt itself from stdin.
    """
    from .launch import launch

    # A new option is one decorator line above and one keyword parameter of `launch`.
    options["verbose"] = _verbose(ctx)
    launch(agent=agent, **options)


cli.add_command(_config_group)
cli.add_command(_sessions)


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback requires a token.")
@click.option("--port", default=0, type=int, help="0 picks a free port.")
@click.option("--runners", default=1, type=click.IntRange(0, 64), show_default=True,
              help="Runner processes supervised in this process.")
@click.option("--token", envvar="OMNIGENT_SERVER_TOKEN",
              help="Bearer token clients must send (generated and printed when needed).")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="NAME",
              help="Also answer requests whose Host is NAME (a proxy or DNS name in front); repeatable.")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="Keep the store (DIR/chat.db) and the logs here instead of $OMNIGENT_DATA_DIR or ~/.omnigent.")
@click.option("--database-uri", default=None, metavar="sqlite:///PATH",
              help="The store file, anywhere (the original's flag; only sqlite:/// is supported).")
def server(host: str, port: int, runners: int, token: str | None, allow_hosts: tuple[str, ...],
           data_dir: Path | None, database_uri: str | None) -> None:
    """Serve the API (sessions, event streams) on the persistent store, with local runners.

    On loopback without --token the API is open to every local user (one
    warning line says so); with --token, or on any other address, clients
    must send the token. Runners never use it: each has its own secret.
    """
    import secrets
    from functools import partial

    import trio

    from .tree.local import run_tree
    from .server.sockets import LOOPBACK
    from .store import StoreError, default_db_path
    from .config.tuning import tuning_from_env

    from .runner.retry import policy_from_env

    try:
        tuning = tuning_from_env()
        policy_from_env()  # the runners read it per turn; a bad value is said here, once
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    db_path = _database_path(database_uri) if database_uri is not None else None
    if data_dir is not None:
        # the logs follow the data dir too (they are found through OMNIGENT_DATA_DIR)
        os.environ["OMNIGENT_DATA_DIR"] = str(data_dir.expanduser().absolute())
    if db_path is None:
        db_path = default_db_path()
    public = host not in LOOPBACK
    if public and not token:
        token = secrets.token_urlsafe(24)
        click.echo(f"token: {token}  (clients send: Authorization: Bearer <token>)", err=True)

    def make_front():
        async def front(client) -> int:
            if not token:  # said once it listens, so a start-up failure stays one line
                click.echo("warning: no --token: any local user can use this server's API "
                           "(sessions, conversations)", err=True)
            click.echo(f"omnigent server listening on {client.base_url} with {runners} runner(s)")
            sys.stdout.flush()
            await trio.sleep_forever()

        return front

    try:
        code = trio.run(partial(run_tree, runners=runners, tuning=tuning, bind=(host, port), token=token,
                                require_token=bool(token), allow_hosts=allow_hosts, take_over=True),
                        db_path, make_front)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:  # the address is taken or not ours
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sys.exit(0 if code in (130, 143) else code)  # asked to stop: a clean exit


@cli.group(invoke_without_command=True)
@click.option("--server", "server_url", metavar="URL", help="The omnigent server this host serves.")
@click.option("--workspace-root", "roots", multiple=True, metavar="DIR",
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Let the server start runners in DIR and below it; repeatable.")
@click.option("--idle-exit", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Leave SECONDS after the last runner ended (default: never).")
@click.option("--foreground", is_flag=True, help="Stay in this process, logging to stderr too.")
@click.option("--token", envvar="OMNIGENT_REMOTE_AUTH_TOKEN", metavar="TOKEN",
              help="Bearer token to register this host (default: $OMNIGENT_REMOTE_AUTH_TOKEN).")
@click.option("--permissions", type=click.Choice(["ask", "auto", "deny"]), default="ask", show_default=True,
              help="The most this host's tools may do: ask before each side-effecting call, auto (run all), "
                   "deny (run none).")
@click.option("--log-file", type=click.Path(path_type=Path), hidden=True)
@click.pass_context
def host(ctx: click.Context, server_url, roots, idle_exit, foreground, token, permissions, log_file) -> None:
    """Run the host daemon for --server URL: it launches runners there when the server asks."""
    if ctx.invoked_subcommand is not None:
        return
    if server_url is None:
        raise click.ClickException("--server URL is required (or use `omnigent host status|stop`)")
    from .host.commands import run_host

    sys.exit(run_host(_check_server_url(server_url), roots=[str(r.absolute()) for r in roots],
                      idle_exit=idle_exit, foreground=foreground, token=token, log_file=log_file,
                      permissions=permissions))


@host.command("status")
@click.option("--server", "server_url", metavar="URL", help="Only the daemon for this server.")
def host_status(server_url) -> None:
    """Show this HOME's host daemons."""
    from .host.commands import status

    sys.exit(status(_check_server_url(server_url) if server_url else None))


@host.command("stop")
@click.option("--server", "server_url", metavar="URL", help="Only the daemon for this server.")
def host_stop(server_url) -> None:
    """Stop this HOME's host daemons (their runners too)."""
    from .host.commands import stop

    sys.exit(stop(_check_server_url(server_url) if server_url else None))


@cli.command()
@click.argument("session_id")
@click.option("--server", "server_url", metavar="URL",
              help="The server (default: the one this HOME's host daemon uses, if any).")
@click.option("--watch", is_flag=True, help="Read-only: follow the session, send nothing.")
@click.option("--token", help="Bearer token for the server (default: $OMNIGENT_REMOTE_AUTH_TOKEN).")
def attach(session_id: str, server_url: str | None, watch: bool, token: str | None) -> None:
    """Follow SESSION_ID live from any terminal: its history, then every turn, from any client."""
    from .repl.attach import run_attach

    sys.exit(run_attach(session_id, server_url, watch=watch, token=token))


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=0, type=int, help="0 picks a free port.")
def mock_llm(host: str, port: int) -> None:
    """A scripted OpenAI-compatible server for tests and offline demos."""
    from .testing.mock_llm import ListenError, main as serve_mock

    try:
        serve_mock(host, port)
    except ListenError as exc:
        raise click.ClickException(str(exc)) from None


def _database_path(uri: str) -> Path:
    """The file of a `sqlite:///PATH` URI (`sqlite:////abs` or `sqlite:///rel`, as SQLAlchemy reads them)."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix) or len(uri) == len(prefix):
        scheme = uri.split(":", 1)[0] if ":" in uri else uri
        raise click.ClickException(f"--database-uri: only sqlite:///PATH is supported, not {scheme!r}: {uri}")
    path = uri[len(prefix):].split("?", 1)[0]
    if path == ":memory:":
        raise click.ClickException("--database-uri: an in-memory store keeps nothing; give a file path")
    return Path(path).expanduser().absolute()


def main() -> None:
    from .config.dirs import DiskError

    code: int | str | None = 0
    try:
        cli.main(prog_name="omnigent", standalone_mode=False)
    except click.exceptions.Abort:
        code = 130
    except click.ClickException as exc:
        exc.show()
        code = exc.exit_code
    except DiskError as exc:  # the data dir, a log or free space: one line, like a store error
        click.ClickException(str(exc)).show()
        code = 1
    except KeyboardInterrupt:
        code = 130
    except SystemExit as exc:
        code = exc.code
    _exit(code)


def _exit(code: int | str | None) -> None:
    """Leave without interpreter teardown: everything is closed by now, and tearing
    down quart, openai's types and friends costs ~0.1 s of a one-shot run."""
    import logging

    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    logging.shutdown()
    early = sys.modules.get("omnigent.tree.early")
    if early is not None:  # an early runner nobody adopted (an error before the tree): no process left behind
        early.discard_pending()
    sys.stdout.flush()
    sys.stderr.flush()
    mark("cli.exit")
    os._exit(code or 0)
