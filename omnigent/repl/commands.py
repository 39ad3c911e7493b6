"""The REPL's slash commands: `/history`, `/switch`, `/new`, `/retry`, `/permissions`, `/usage`, `/help`, `/quit`.

A mixin of `repl.Repl` (the commands read and change the attached
conversation, which the REPL owns); `attach.Attached` narrows it. The
strings the seeds match are kept exactly: `Switch to…`, the full ids, and
`  /switch <#> or <id> to resume`.
"""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING, Any

from ..client import OmnigentError
from .render import session_table, transcript
from .rules import permissions_command, usage_command

if TYPE_CHECKING:
    from ..client import OmnigentClient
    from .console import Console
    from .render import LiveRenderer

HELP = """\
Commands:
  /history           show the whole conversation again
  /switch            list recent conversations
  /switch <#|id>     resume one of them
  /new               start a new conversation
  /retry             run the last interrupted or cancelled turn again (from the step it stopped at)
  /permissions       list this session's "always" approvals
  /permissions revoke <#>  remove one of them
  /usage             tokens this session used
  /help              this list
  /quit, /exit       leave (Ctrl-D too)
Ctrl-C cancels a running turn; at the prompt it clears the line.
A tool call that needs approval asks: y allows it, n refuses it, a allows this
tool with this command (or path) for the rest of the session.
"""
NO_CONVERSATION = "  No conversation yet: it starts with your first message."


class Commands:
    """The slash commands of a REPL (see module doc); the attributes are the REPL's."""

    client: OmnigentClient
    console: Console
    renderer: LiveRenderer
    session_id: str | None
    _quit: bool

    async def _attach(self, session_id: str, info: dict[str, Any] | None = None) -> None:
        raise NotImplementedError

    def _detach(self) -> None:
        raise NotImplementedError

    async def _send(self, text: str | None) -> None:
        raise NotImplementedError

    async def _command(self, line: str) -> None:
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        if name in ("/quit", "/exit"):
            self._quit = True
        elif name == "/help":
            self.console.write(HELP)
        elif name == "/history":
            await self._history()
        elif name == "/switch":
            await self._switch(arg)
        elif name == "/new":
            self._detach()
            self.console.line("  New conversation: it starts with your next message.")
        elif name == "/permissions":
            await self._permissions(arg)
        elif name == "/usage":
            await self._usage()
        elif name == "/retry":
            if self.session_id is None:
                self.console.line("  Nothing to retry yet.")
            else:
                await self._send(None)
        else:
            self.console.line(f"Unknown command {name}: type /help for the commands.", err=True)

    async def _history(self) -> None:
        if self.session_id is None:
            self.console.line(NO_CONVERSATION)
            return
        items = await self.client.list_items(self.session_id)
        self.console.write(transcript(items, self.console.style, self.renderer.markdown,
                                      await self._turns(self.session_id)))

    async def _turns(self, session_id: str) -> list[dict[str, Any]]:
        """The session's turns, to mark the cancelled ones (a server without the route has none)."""
        try:
            return await self.client.list_turns(session_id)
        except OmnigentError as exc:
            if exc.status_code in (404, 405):
                return []
            raise

    async def _switch(self, arg: str) -> None:
        if not arg or arg.isdigit():
            rows = await self.client.list_sessions(limit=20)
            if not arg:
                width = shutil.get_terminal_size().columns if self.console.screen else None
                self.console.write(session_table(rows, max_width=width))
                return
            if not 1 <= int(arg) <= len(rows):
                self.console.line(f"No session #{arg} ({len(rows)} listed). "
                                  "Run /switch with no argument to see the table.")
                return
            arg = rows[int(arg) - 1]["id"]
        try:
            info = await self.client.get_session(arg)
        except OmnigentError as exc:
            if exc.status_code != 404:
                raise
            self.console.error(f"Conversation '{arg}' not found.")
            return
        await self._attach(arg, info)

    async def _permissions(self, arg: str) -> None:
        if self.session_id is None:
            self.console.line(NO_CONVERSATION)
            return
        await permissions_command(self.client, self.console, self.session_id, arg)

    async def _usage(self) -> None:
        if self.session_id is None:
            self.console.line(NO_CONVERSATION)
            return
        await usage_command(self.client, self.console, self.session_id)
