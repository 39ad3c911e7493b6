"""`omnigent attach SESSION_ID`: the REPL, attached to a session another client drives.

It is the REPL (`repl.py`) with three differences, so there is one input
loop and one renderer, not two:
- it replays the session from its stored event log (`after=0`): every
  turn as it streamed, or, where the log was compacted or the session is
  older than it, one `session.resync` snapshot printed as a transcript;
  then it tails the session live;
- it shows what other clients do: their messages (`session.input.consumed`
  of a turn that is not ours), their answers, and runner incidents
  (rebinds, retries, interrupted turns);
- it answers the session's approvals, whoever's turn asked: the pending
  ones are asked once the replay is shown, and after an answer it follows
  that turn to its end, asking what else it asks; one that comes while the
  prompt waits is announced, and an empty line answers it;
- `--watch` makes it read-only: a line is refused with one notice, and
  nothing is ever posted. Leaving (or being killed) cancels nothing: a turn
  runs to its end whoever watches it.

The server is `--server URL`; without it, the server of this HOME's host
daemon (the second line of `~/.omnigent/host.pid`, written by
`omnigent host` / `omnigent run --server`). Local runs have no server
another process could reach, so with neither there is nothing to attach
to: one line, exit 2.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import trio

from protocol import events as ev

from ..client import OmnigentClient, OmnigentError, message_text
from .options import FrontOptions
from .render import render_item, transcript
from .safe import neutralise
from .repl import Repl

NO_SERVER = ("no server to attach to: give --server URL (local `omnigent run` sessions live "
             "inside that process; `omnigent server` or `omnigent host --server URL` make one)")
REPLAY_WAIT = 10.0  # seconds the prompt waits for the replay to be shown
READ_ONLY = "read-only (--watch): this terminal only watches; /quit to leave"
NOT_HERE = "{name} is not available in omnigent attach: it follows one session"


def default_server(home: Path | None = None) -> str | None:
    """The server of this HOME's most recent host daemon, if one was started (`host.pid`)."""
    path = (home or Path.home()) / ".omnigent" / "host.pid"
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    url = lines[1].strip() if len(lines) > 1 else ""
    return url if url.startswith(("http://", "https://")) else None


class Attached(Repl):
    """The REPL following `session_id` from its first event; `watch` makes it read-only."""

    def __init__(self, client: OmnigentClient, session_id: str, lines: Any, *, watch: bool) -> None:
        options = FrontOptions(agent_path="", agent_name="", bundle=b"", ephemeral=True)
        self.watch = watch  # before the REPL's set-up: it decides whether approvals are answered here
        super().__init__(client, options, session_id, lines)
        self._sent: str | None = None  # the text of our message in flight (not echoed twice)
        self._replay_until = 0  # the newest event when we attached: the replay ends there
        self._rendered = 0
        self._progress = trio.Event()

    async def _attach(self, session_id: str, info: dict[str, Any] | None = None) -> None:
        try:
            info = info or await self.client.get_session(session_id)
        except OmnigentError as exc:
            if exc.status_code == 404:
                raise OmnigentError(f"Conversation '{session_id}' not found.", 404, "not_found") from None
            raise
        mode = "watching" if self.watch else "attached to"
        self.console.line(self.console.style.dim(
            f"{mode} conversation {neutralise(session_id)} ({neutralise(info.get('agent_name') or 'agent')}) on "
            f"{self.client.base_url} · Ctrl-D to leave"))
        self._replay_until = info.get("last_sequence_number") or 0
        await self._follow(session_id, 0)  # replay from the log, then live
        with trio.move_on_after(REPLAY_WAIT):  # the replay above the prompt, not under it
            while self._rendered < self._replay_until:
                await self._progress.wait()
        # what the replay left pending, as the server has it
        await self.approvals.refresh(session_id, await self.client.list_turns(session_id))

    def _on_event(self, session_id: str, event: dict[str, Any]) -> None:
        if session_id != self.session_id:
            return
        self._rendered = max(self._rendered, event.get("sequence_number") or 0)
        self._progress.set()
        self._progress = trio.Event()
        kind = event["type"]
        if kind == ev.RESYNC:
            self.console.end_line()
            self.console.write(transcript(event["items"], self.console.style, self.renderer.markdown, event["turns"]))
            self.renderer.calls.seen(event["items"])
            turns = event["turns"]
            if turns and turns[-1]["status"] in ("queued", "running"):
                self.console.notice("(a turn is running)")
            return
        if kind == ev.INPUT_CONSUMED:
            if not self._ours(event):
                shown = render_item(event["item"], self.console.style)
                if shown is not None:
                    self.console.line(shown)
            self._sent = None
        elif kind == ev.TURN_INTERRUPTED:
            self.console.notice(f"turn interrupted: {neutralise(str(event['reason']))}")
        elif kind == ev.TURN_RETRIED:
            self.console.notice(f"retrying the turn (attempt {event['attempt']})")
        super()._on_event(session_id, event)

    def _can_answer(self) -> bool:
        return not self.watch

    def _ours(self, event: dict[str, Any]) -> bool:
        """Our own message: the terminal shows it already, as the user typed it."""
        turn = self._turn
        if turn is None or self._sent is None or turn.turn_id not in (None, event.get("turn_id")):
            return False
        return message_text(event["item"]) == self._sent

    async def _send(self, text: str | None) -> None:
        if self.watch:
            self.console.notice(READ_ONLY)
            return
        self._sent = text
        await super()._send(text)

    async def _command(self, line: str) -> None:
        name = line.partition(" ")[0]
        if name in ("/new", "/switch"):
            self.console.line(NOT_HERE.format(name=name))
            return
        await super()._command(line)

    def _resume_hint(self) -> None:
        if self._last_session is not None:
            self.console.line(f"Attach again with: omnigent attach {shlex.quote(self._last_session)} "
                              f"--server {shlex.quote(str(self.client.base_url))}", err=True)


async def attach(server: str, session_id: str, *, watch: bool, token: str | None) -> int:
    """Run `omnigent attach`: the exit code (0 on Ctrl-D or /quit, 1 when the session is unknown)."""
    from .terminal import history_path, open_input

    async with OmnigentClient(server, token=token) as client:
        async with open_input(None if watch else history_path()) as lines:
            return await Attached(client, session_id, lines, watch=watch).run()


def run_attach(session_id: str, server: str | None, *, watch: bool, token: str | None) -> int:
    """The CLI's entry: resolve the server, then run under trio. Returns the exit code."""
    import sys

    server = server or default_server()
    if server is None:
        print(f"Error: {NO_SERVER}", file=sys.stderr, flush=True)
        return 2
    token = token or os.environ.get("OMNIGENT_REMOTE_AUTH_TOKEN") or None
    try:
        return trio.run(lambda: attach(server.rstrip("/"), session_id, watch=watch, token=token))
    except KeyboardInterrupt:
        return 130
