"""`omnigent config get|set|unset|list|path`: the config file without an editor.

`set` checks the key and the value as a run would read them (a harness or a
permission mode that does not exist is refused before anything is written),
writes the file atomically (0600, in a 0700 directory) and keeps everything
else in it, other tools' sections included. Credentials are refused: they
belong in the environment, where a file copied to another machine, a backup
or a dotfiles repository cannot take them along.

`list` shows each key, the value a run would start from and where it comes
from: the environment (`OMNIGENT_MODEL`/`OMNIGENT_HARNESS`, which beat agent
files), the file, or nothing (what a run does then).

Imports click only; yaml is imported by the command that reads the file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from .file import Config

# `omnigent --help` imports this module: the file's module (and yaml) only when a command runs.

_UNSET = {
    "model": "not set: the agent file's executor.model",
    "harness": "not set: the agent file's executor.harness, else openai-agents",
    "permissions": "not set: no ceiling (the agent's permissions, else ask)",
    "default_agent": "not set: `omnigent run` needs AGENT",
    "server": "not set: each run starts its own local server",
}


@click.group()
def config() -> None:
    """Read and change the defaults in the config file.

    The file is $OMNIGENT_CONFIG_HOME/config.yaml, else ~/.omnigent/config.yaml.
    Keys: model, harness, permissions (a ceiling on what tools may do),
    default_agent, server.
    """


@config.command("get")
@click.argument("key")
def get(key: str) -> None:
    """Print the value of KEY a run starts from (exit 1 when it is not set)."""
    key = _known(key)
    value, _ = _effective(_load(), key)
    if value is None:
        click.echo(f"{key}: {_UNSET[key]}", err=True)
        raise SystemExit(1)
    click.echo(value)


@config.command("set")
@click.argument("key")
@click.argument("value")
def set_(key: str, value: str) -> None:
    """Store VALUE for KEY in the config file."""
    from .file import check_value

    key = _known(key)
    base = Path.cwd() if key == "default_agent" else None
    try:
        checked = check_value(key, value, base=base)
    except ValueError as exc:
        raise click.ClickException(f"{key}: {exc}") from None
    if key == "default_agent" and not os.path.exists(checked):
        raise click.ClickException(f"default_agent: {checked}: no such file or directory")
    _write(key, checked)


@config.command("unset")
@click.argument("key")
def unset(key: str) -> None:
    """Remove KEY from the config file."""
    _write(_known(key), None)


@config.command("path")
def path() -> None:
    """Print where the config file is (whether or not it exists yet)."""
    from .file import config_path

    click.echo(str(config_path()))


@config.command("list")
def list_() -> None:
    """Show every key, its value and where it comes from."""
    from .file import KEYS

    cfg = _load()
    rows = []
    for key in KEYS:
        value, source = _effective(cfg, key)
        rows.append((key, value if value is not None else "-", source))
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    for key, value, source in rows:
        click.echo(f"{key:<{widths[0]}}  {value:<{widths[1]}}  {source}".rstrip())


def _effective(cfg: Config, key: str) -> tuple[str | None, str]:
    from .file import ENV_OVERRIDES

    var = ENV_OVERRIDES.get(key)
    env = (os.environ.get(var) or "").strip() if var else ""
    if var and env:
        return env, f"environment ({var}; beats agent files)"
    value = cfg.get(key)
    if value is not None:
        return value, f"config file ({cfg.path})"
    return None, _UNSET[key]


def _known(key: str) -> str:
    import difflib

    from .file import KEYS, is_secret

    if key in KEYS:
        return key
    if is_secret(key):
        raise click.ClickException(
            f"{key}: credentials are not kept in the config file; set OPENAI_API_KEY (and "
            f"OPENAI_BASE_URL) in the environment, or name a variable in the agent's executor.auth")
    near = difflib.get_close_matches(key, KEYS, n=1, cutoff=0.6)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise click.ClickException(f"unknown config key {key!r} ({hint}known: {', '.join(KEYS)})")


def _load() -> Config:
    from .file import ConfigError, load_config

    try:
        return load_config()
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def _write(key: str, value: str | None) -> None:
    from .file import ConfigError, config_path, set_value

    try:
        set_value(config_path(), key, value)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
