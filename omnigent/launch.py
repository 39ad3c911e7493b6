"""`omnigent run`, from its options to a running tree: what the command does once click has parsed it.

The CLI module keeps only the option list (so adding a flag is one line
there); this module resolves what the run is for, checks everything that can
be checked before a process starts (each failure one `click.ClickException`
line), and then hands over to the local tree (`tree.local.run_tree`) or to
a server's host daemon (`tree.remote.run_remote`). The order of the checks is
part of the contract: nothing is started, and nothing written, before the
agent, the credentials and the environment's settings are known to be usable.

The config file (`config.file`) fills in what the options leave open: the
agent of a bare `omnigent run`, the server, `model`/`harness` below the agent
file (`agents.load.pick`), and a ceiling on what tools may do
(`permission_plan`).
"""

from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import click

NO_ENDPOINT = (
    "no model endpoint configured: set OPENAI_API_KEY (and OPENAI_BASE_URL for any "
    "OpenAI-compatible server), or try offline: `omnigent mock-llm --port 8765 &` then "
    "OPENAI_BASE_URL=http://127.0.0.1:8765/v1 OPENAI_API_KEY=mock"
)
NO_AGENT = ("no AGENT given and no default agent configured: name an agent file, "
            "or set one with `omnigent config set default_agent PATH`")


def permission_plan(flag: str | None, spec_mode: str, ceiling: str | None, *,
                    remote: bool) -> tuple[str | None, str | None]:
    """(the session's own mode, the local host's tool policy) for a run.

    The config's `permissions` is a ceiling, like `omnigent host --permissions`:
    the effective mode (the strictest of the session's own, else the spec's,
    and the host's) never exceeds it. Locally it is the in-process host's
    policy, which the server and the runner both enforce. With `--server` the
    daemon's policy is its own, so the ceiling goes into the session's mode
    instead, combined with what the flag or else the agent asked for. (So a
    resumed remote session's own earlier mode is replaced by that: never above
    the ceiling, possibly looser than a stricter mode it had; the front end
    would have to read the session first to do better.) Without a ceiling
    the flag alone decides, as before.
    """
    from .tools.policy import strictest

    if ceiling is None:
        return flag, flag
    if remote:
        return strictest(flag or spec_mode, ceiling), None
    return flag, strictest(flag, ceiling)


def launch(*, agent: Path | None, model: str | None, harness: str | None, system_prompt: str | None,
           prompt: str | None, resume: str | None, resume_latest: bool, no_session: bool,
           server_url: str | None, token: str | None, permission_mode: str | None,
           output_format: str | None, verbose: bool, fork: str | None = None,
           title: str | None = None, raw: bool = False) -> NoReturn:
    """Run `omnigent run` with these options; exits with the run's code."""
    early = None
    if server_url is None and not no_session:  # it imports openai while the tree is built (tree/early.py)
        from .tree.early import start as start_early

        early = start_early()
    from .agents import SpecError, bundle_from_spec, load_spec, resolve_auth
    from .config.file import ConfigError, load_config

    if output_format is not None and prompt is None:
        raise click.ClickException("--output-format applies to -p only (the REPL prints text)")
    if fork is not None:  # the original's refusals (reference §1.2)
        if prompt is not None:
            raise click.ClickException("--fork requires interactive REPL mode; remove -p/--prompt.")
        if resume or resume_latest or no_session:
            raise click.ClickException("--fork cannot be combined with --resume, --continue or --no-session")
    if title is not None and not title.strip():
        raise click.ClickException("--name cannot be empty")
    try:
        config = load_config(warn=(lambda line: click.echo(f"warning: {line}", err=True)) if verbose else None)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if agent is None:
        if config.default_agent is None:
            raise click.ClickException(NO_AGENT)
        agent = Path(config.default_agent)
    stdin = None
    if prompt == "-":
        from .repl.stdin import StdinError, read_prompt

        try:
            prompt = read_prompt()
        except StdinError as exc:
            raise click.ClickException(str(exc)) from None
    elif prompt is not None:
        from .repl.stdin import StdinContext, StdinError, kind, timeout_from_env

        if kind(0) is not None:
            try:
                stdin = StdinContext(timeout=timeout_from_env())
            except StdinError as exc:
                raise click.ClickException(str(exc)) from None
    if prompt is not None:
        check_prompt(prompt)
    if server_url is None and not no_session:
        server_url = config.server  # --no-session is a local run whatever the config says
    if server_url is not None:
        if no_session:
            raise click.ClickException("--no-session is not supported with --server; the uploaded agent "
                                       "is already scoped to the CLI session.")
        server_url = check_server_url(server_url)

    os.environ.update(config.auth_fallback(os.environ))  # runners inherit it; never over a set variable
    try:
        spec = load_spec(agent, model=model, harness=harness, system_prompt=system_prompt,
                         environ=os.environ, defaults={"model": config.model, "harness": config.harness})
        auth = resolve_auth(spec, os.environ)
    except SpecError as exc:
        raise click.ClickException(str(exc)) from None
    if not auth.get("api_key") and not auth.get("base_url"):
        raise click.ClickException(NO_ENDPOINT)
    from .config.tuning import tuning_from_env

    from .runner.retry import policy_from_env

    try:
        tuning = tuning_from_env()
        policy_from_env()  # the runners read it per turn; a bad value is said here, once
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if no_session and (resume or resume_latest):
        raise click.ClickException("--no-session cannot be combined with --resume or --continue")
    session_mode, host_policy = permission_plan(permission_mode, spec.permissions, config.permissions,
                                                remote=server_url is not None)

    from .repl.options import FrontOptions

    import trio

    spare_gate = trio.Event()  # the REPL's warm spare starts once it is set (see tree.local)
    options = FrontOptions(
        agent_path=str(agent), agent_name=spec.name, bundle=bundle_from_spec(spec), prompt=prompt,
        resume=resume, resume_latest=resume_latest, workspace=os.getcwd(), ephemeral=no_session,
        idle=spare_gate.set, permission_mode=session_mode, output_format=output_format or "text",
        stdin=stdin, verbose=verbose, fork=fork, title=" ".join(title.split()) if title is not None else None, raw=raw,
    )

    def started(run: Any) -> Any:  # the stdin wait counts from the start of the run: it overlaps start-up
        async def main() -> Any:
            if stdin is not None:
                stdin.started = trio.current_time()
            return await run()

        return main

    if server_url is not None:
        from .tree.remote import run_remote

        if early is not None:  # the config file's server: this run places its session there
            early.discard()

        sys.exit(trio.run(started(partial(run_remote, options, server_url=server_url, token=token,
                                          auth=auth))))

    from .tree.local import run_tree

    def make_front() -> Any:
        from .repl.front import Front  # once the runner is launched: it pulls in the HTTP client

        return Front(options).run

    tmp = None
    if no_session:
        import tempfile

        # Everything that follows the data dir (store, logs, input history) goes
        # here and is removed at exit: nothing is written under HOME.
        try:
            tmp = Path(tempfile.mkdtemp(prefix="omnigent-chat-"))
        except OSError as exc:
            raise click.ClickException(f"cannot create a temporary directory: "
                                       f"{tempfile.gettempdir()}: {exc.strerror or exc}") from None
        os.environ["OMNIGENT_DATA_DIR"] = str(tmp)
    from .store import StoreError, default_db_path

    db_path = default_db_path()

    try:
        # The REPL owns Ctrl-C (it cancels a turn); -p leaves it to the tree: exit 130.
        # The REPL keeps a warm spare runner (~50 MiB) so a crash costs ~0.1 s, not ~0.8 s;
        # it starts once the first turn is done or the REPL waits at a terminal prompt.
        one_shot = prompt is not None
        # host_policy: the local host's bound on the machine that runs the tools (None: the session decides)
        code = trio.run(started(partial(run_tree, db_path, make_front, handle_sigint=one_shot, runners=1,
                                        spares=0 if one_shot else 1, spare_gate=spare_gate, tuning=tuning,
                                        early=early, permission_mode=host_policy)))
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        if tmp is not None:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(code)


def check_server_url(url: str) -> str:
    """An http(s) URL with a host, without its trailing slash."""
    from urllib.parse import urlsplit

    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise click.ClickException(f"--server: expected an http(s)://HOST[:PORT] URL, not {url!r}")
    return url.strip().rstrip("/")


def check_prompt(prompt: str) -> None:
    """A `-p` text the model can be sent: UTF-8, not empty (checked before anything starts)."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:  # argv bytes that are not UTF-8 arrive as lone surrogates
        bad = prompt[exc.start].encode("utf-8", "surrogateescape")
        raise click.ClickException(
            f"the prompt is not valid UTF-8 (byte 0x{bad.hex()} at character {exc.start + 1})") from None
    if not prompt.strip():
        raise click.ClickException("empty prompt")
