"""The `omnigent sessions` group: list, show, export, rename, rm, fork.

Only click is imported here; each command imports what it needs when it
runs, so `omnigent --help` stays instant and the local commands never load
the server, the model client or trio. Without `--server` they act on the
store file (`$OMNIGENT_DATA_DIR/chat.db`) directly; with it, through that
server's API. Every failure is one `Error:` line and exit 1.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from .backend import Catalog

_F = TypeVar("_F", bound=Callable[..., Any])


def _where(fn: _F) -> _F:
    """`--server URL` and `--token`, as `omnigent run` takes them, on every sub-command."""
    fn = click.option("--token", envvar="OMNIGENT_REMOTE_AUTH_TOKEN", metavar="TOKEN",
                      help="Bearer token for --server (default: $OMNIGENT_REMOTE_AUTH_TOKEN).")(fn)
    fn = click.option("--server", "server_url", metavar="URL",
                      help="Act through the omnigent server at URL (default: the local store, directly).")(fn)
    return fn


@contextmanager
def _catalog(server_url: str | None, token: str | None) -> Iterator[Catalog]:
    from .backend import CatalogError, check_server_url

    try:
        catalog: Catalog
        if server_url is None:  # the store file, directly
            from .local import LocalCatalog

            catalog = LocalCatalog()
        else:
            from .remote import RemoteCatalog

            catalog = RemoteCatalog(check_server_url(server_url), token=token)
        try:
            yield catalog
        finally:
            catalog.close()
    except CatalogError as exc:
        raise click.ClickException(str(exc)) from None


def _emit(text: str) -> None:
    """Write to stdout; a reader that went away (`| head`) ends the command quietly."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        raise SystemExit(0) from None


def _single_line(value: str, what: str) -> str:
    value = " ".join(value.split())
    if not value:
        raise click.ClickException(f"{what} cannot be empty")
    return value


@click.group("sessions", invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def sessions(ctx: click.Context) -> None:
    """Find, read, export, name, fork and remove conversations.

    \b
      omnigent sessions list -q "invoice"        search every message
      omnigent sessions show conv_…               read one
      omnigent sessions export conv_… -o chat.md  keep it as Markdown
      omnigent sessions fork conv_… --name try-2  branch off, then: omnigent run AGENT -r <new id>

    Without --server these act on the local store ($OMNIGENT_DATA_DIR/chat.db,
    else ~/.omnigent/chat.db) directly; no server or runner is started.
    """
    if ctx.invoked_subcommand is None:  # a bare `omnigent sessions` is a question: the help, exit 0
        click.echo(ctx.get_help())


@sessions.command("list")
@click.option("--agent", metavar="NAME", help="Only the sessions of this agent (its YAML `name`).")
@click.option("-n", "--limit", type=click.IntRange(min=0), default=20, show_default=True, metavar="N",
              help="At most this many, most recently active first (0: all).")
@click.option("-q", "--query", metavar="TEXT", help="Only the sessions whose messages match TEXT (full-text search).")
@click.option("--json", "as_json", is_flag=True, help="A JSON array instead of a table.")
@_where
def list_sessions(agent: str | None, limit: int, query: str | None, as_json: bool, server_url: str | None,
                  token: str | None) -> None:
    """List sessions: id, last activity, messages, agent and name."""
    if query is not None and not query.strip():
        raise click.ClickException("-q: the search text is empty")
    with _catalog(server_url, token) as catalog:
        rows = catalog.list_sessions(agent=agent, limit=limit or None, query=query)
    if catalog.note:
        click.echo(catalog.note, err=True)
    if as_json:
        from .export import dumps

        _emit(dumps(rows, indent=2) + "\n")
        return
    if not rows:
        what = f"matches {query!r}" if query is not None else "yet"
        click.echo(f"No session {what}." if query is not None else f"No sessions {what}.", err=True)
        return
    import shutil
    import time

    from .listing import table

    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    _emit("".join(line + "\n" for line in table(rows, time.time(), max_width=width)))


@sessions.command("show")
@click.argument("session_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="The session and its items as one JSON object.")
@click.option("--markdown", is_flag=True, help="As Markdown (what `export` writes).")
@_where
def show(session_id: str, as_json: bool, markdown: bool, server_url: str | None, token: str | None) -> None:
    """Print session ID: its messages, tool calls and results, as a transcript."""
    if as_json and markdown:
        raise click.ClickException("--json and --markdown are exclusive: choose one")
    from . import export

    with _catalog(server_url, token) as catalog:
        session = catalog.session(session_id)
        items = catalog.items(session_id)
    if as_json:
        _emit(export.document(session, items))
    elif markdown:
        _emit(export.markdown(session, items))
    else:
        _emit(export.transcript(session, items))


@sessions.command("export")
@click.argument("session_id", metavar="ID")
@click.option("--format", "fmt", type=click.Choice(["markdown", "jsonl"]), default="markdown", show_default=True,
              help="Markdown for people, JSON Lines (a session line, then one line per item) for programs.")
@click.option("-o", "--output", metavar="FILE", help="Write to FILE (created 0600) instead of stdout.")
@_where
def export_session(session_id: str, fmt: str, output: str | None, server_url: str | None,
                   token: str | None) -> None:
    """Write session ID as Markdown or JSON Lines."""
    from . import export

    with _catalog(server_url, token) as catalog:
        session = catalog.session(session_id)
        items = catalog.items(session_id)
    text = export.markdown(session, items) if fmt == "markdown" else "".join(export.jsonl(session, items))
    if output is None or output == "-":
        _emit(text)
        return
    from .files import write_private

    try:
        write_private(output, text)
    except OSError as exc:
        raise click.ClickException(f"cannot write {output}: {exc.strerror or exc}") from None
    click.echo(f"Exported {session_id} ({len(items)} items) to {output}", err=True)


@sessions.command("rename")
@click.argument("session_id", metavar="ID")
@click.argument("title")
@_where
def rename(session_id: str, title: str, server_url: str | None, token: str | None) -> None:
    """Name session ID TITLE (what `list`, the picker and /switch show)."""
    title = _single_line(title, "the name")
    with _catalog(server_url, token) as catalog:
        catalog.rename(session_id, title)
    click.echo(f"Renamed {session_id} to {title!r}")


@sessions.command("rm")
@click.argument("session_id", metavar="ID")
@click.option("-y", "--yes", is_flag=True, help="Do not ask (needed when stdin is not a terminal).")
@_where
def remove(session_id: str, yes: bool, server_url: str | None, token: str | None) -> None:
    """Delete session ID with everything it holds; a turn it is running is cancelled first."""
    with _catalog(server_url, token) as catalog:
        session = catalog.session(session_id)
        if not yes:
            if not sys.stdin.isatty():
                raise click.ClickException(f"not deleting {session_id}: stdin is not a terminal, so nobody can "
                                           f"confirm; pass --yes")
            name = " ".join((session.get("title") or "untitled").split())
            messages = session.get("message_count") or 0
            try:
                ok = click.confirm(f"Delete session {session_id} ({name!r}, {messages} "
                                   f"message{'' if messages == 1 else 's'})?", default=False)
            except click.Abort:  # Ctrl-C or Ctrl-D at the question: a no
                click.echo(err=True)
                ok = False
            if not ok:
                raise click.ClickException("nothing deleted")
        catalog.delete(session_id)
    click.echo(f"Deleted {session_id}")


@sessions.command("fork")
@click.argument("session_id", metavar="ID")
@click.option("--at", "at", metavar="RESPONSE_ID",
              help="Copy the history up to and including this response, or this item (both ids are in "
                   "`show ID --json`); default: all of it.")
@click.option("--name", metavar="NAME", help="The fork's name (default: the source's name plus \" (fork)\").")
@_where
def fork(session_id: str, at: str | None, name: str | None, server_url: str | None, token: str | None) -> None:
    """Copy session ID into a new session and print the new id; ID itself stays as it was."""
    title = _single_line(name, "--name") if name is not None else None
    with _catalog(server_url, token) as catalog:
        new = catalog.fork(session_id, at=at, title=title)
    click.echo(new["id"])
    click.echo(f"Forked {session_id} into {new['id']} ({new.get('title') or 'untitled'!r}); "
               f"continue it with: omnigent run AGENT --resume {new['id']}", err=True)
