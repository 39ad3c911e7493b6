"""What the user talks to: one-shot `-p` or the REPL, as a client of a server.

It resolves which conversation to use (explicit id, picker, --continue, or a
fresh one created lazily on the first message) and then either runs one turn
and prints the answer, or hands over to the REPL. A resumed conversation runs
the current agent spec: the bundle is uploaded again before anything is sent.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from .client import OmnigentClient, OmnigentError
from .options import RESUME_PICKER, FrontOptions

if TYPE_CHECKING:
    from .repl.terminal import LineInput


class FrontError(Exception):
    """A user-facing failure: printed as `Error: <message>`, exit 1."""


class Front:
    def __init__(self, options: FrontOptions) -> None:
        self.options = options

    async def run(self, client: OmnigentClient) -> int:
        from .repl.picker import PickError

        try:
            if self.options.prompt is not None:
                return await self.one_shot(client, await self.resolve(client, None))
            from .repl import Repl
            from .repl.terminal import history_path, open_input

            async with open_input(history_path()) as lines:
                session_id = await self.resolve(client, lines)
                return await Repl(client, self.options, session_id, lines).run()
        except (FrontError, OmnigentError, PickError) as exc:
            print(f"Error: {exc}", file=sys.stderr, flush=True)
            return 1
        except KeyboardInterrupt:  # before the REPL owns Ctrl-C, e.g. while picking
            print(file=sys.stderr, flush=True)
            return 130

    async def resolve(self, client: OmnigentClient, lines: LineInput | None) -> str | None:
        """The conversation to attach to, or None for a fresh one. Precedence: id, picker, continue."""
        session_id = await self._find(client, lines)
        if session_id is not None:
            await client.upload_agent(self.options.bundle)
        return session_id

    async def _find(self, client: OmnigentClient, lines: LineInput | None) -> str | None:
        opts = self.options
        if opts.resume and opts.resume != RESUME_PICKER:
            try:
                await client.get_session(opts.resume)
            except OmnigentError as exc:
                if exc.status_code == 404:
                    raise FrontError(f"Conversation '{opts.resume}' not found.") from None
                raise
            return opts.resume
        if opts.resume == RESUME_PICKER:
            from .repl.picker import pick_session

            if lines is not None:
                return await pick_session(client, opts.agent_name, lines)
            from .repl.terminal import open_input

            async with open_input() as lines:
                return await pick_session(client, opts.agent_name, lines)
        if opts.resume_latest:
            rows = await client.list_sessions(agent_name=opts.agent_name, limit=1, sort_by="updated_at")
            if not rows:
                raise FrontError(f"No prior conversation for agent {opts.agent_name!r}.")
            return rows[0]["id"]
        return None

    async def one_shot(self, client: OmnigentClient, session_id: str | None) -> int:
        if session_id is None:
            session_id = (await client.create_session(self.options.bundle,
                                                      workspace=self.options.workspace))["id"]
        result = await client.run_turn(session_id, self.options.prompt or "")
        if result.status == "completed":
            print(result.text, flush=True)
            return 0
        message = (result.error or {}).get("message") or result.status
        print(f"Error: {message}", file=sys.stderr, flush=True)
        return 1
