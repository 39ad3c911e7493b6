"""What the user talks to: one-shot `-p` or the REPL, as a client of a server.

It resolves which conversation to use (explicit id, picker, --continue, or a
fresh one created lazily on the first message) and then either runs one turn
and prints the answer, or hands over to the REPL. A resumed conversation runs
the current agent spec: the bundle is uploaded again before anything is sent.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ..client import OmnigentClient, OmnigentError
from ..config.timeline import mark
from .options import RESUME_PICKER, FrontOptions

if TYPE_CHECKING:
    from .terminal import LineInput


class FrontError(Exception):
    """A user-facing failure: printed as `Error: <message>`, exit 1."""


class Front:
    def __init__(self, options: FrontOptions) -> None:
        self.options = options

    async def run(self, client: OmnigentClient) -> int:
        from .picker import PickError
        from .stdin import StdinError

        try:
            if self.options.prompt is not None:
                return await self.one_shot(client, await self.resolve(client, None))
            from .repl import Repl
            from .terminal import history_path, open_input

            async with open_input(history_path()) as lines:
                session_id = await self.resolve(client, lines)
                return await Repl(client, self.options, session_id, lines).run()
        except (FrontError, OmnigentError, PickError, StdinError) as exc:
            from .safe import neutralise

            print(f"Error: {neutralise(str(exc))}", file=sys.stderr, flush=True)
            return 1
        except KeyboardInterrupt:  # before the REPL owns Ctrl-C, e.g. while picking
            print(file=sys.stderr, flush=True)
            return 130

    async def resolve(self, client: OmnigentClient, lines: LineInput | None) -> str | None:
        """The conversation to attach to, or None for a fresh one. Precedence: id, picker, continue."""
        session_id = await self._find(client, lines)
        if session_id is not None:
            await client.upload_agent(self.options.bundle, session_id=session_id)  # this session only
            if self.options.title is not None and self.options.fork is None:  # --name on a resumed one
                await client.patch_session(session_id, title=self.options.title)
            if self.options.permission_mode is not None:  # the flag applies to a resumed session too
                await client.patch_session(session_id, permission_mode=self.options.permission_mode)
        return session_id

    async def _find(self, client: OmnigentClient, lines: LineInput | None) -> str | None:
        opts = self.options
        if opts.fork is not None:  # a copy of it, named --name (else "<its title> (fork)")
            try:
                forked = await client.sessions.fork(opts.fork, title=opts.title)
            except OmnigentError as exc:
                if exc.status_code == 404:
                    raise FrontError(f"Conversation '{opts.fork}' not found "
                                     f"(`omnigent sessions list` shows the ids).") from None
                raise
            print(f"Forked {opts.fork} into {forked.id}", file=sys.stderr, flush=True)
            return forked.id
        if opts.resume and opts.resume != RESUME_PICKER:
            try:
                await client.get_session(opts.resume)
            except OmnigentError as exc:
                if exc.status_code == 404:
                    raise FrontError(f"Conversation '{opts.resume}' not found.") from None
                raise
            return opts.resume
        if opts.resume == RESUME_PICKER:
            from .picker import pick_session

            if lines is not None:
                return await pick_session(client, opts.agent_name, lines)
            from .terminal import open_input

            async with open_input() as lines:
                return await pick_session(client, opts.agent_name, lines)
        if opts.resume_latest:
            rows = await client.list_sessions(agent_name=opts.agent_name, limit=1, sort_by="updated_at")
            if not rows:
                raise FrontError(f"No prior conversation for agent {opts.agent_name!r}.")
            return rows[0]["id"]
        return None

    async def one_shot(self, client: OmnigentClient, session_id: str | None) -> int:
        """Run `-p`: read stdin as context if asked, run one turn, print it as `output_format` says."""
        from .output import Output

        output = Output(self.options.output_format)
        try:
            return await self._one_shot(client, session_id, output)
        except BaseException as exc:  # an error the front end prints; JSON readers still get their result
            if output.fmt != "text":
                failed = isinstance(exc, Exception)  # else Ctrl-C, SIGTERM: the run is being stopped
                output.finish(status="failed" if failed else "cancelled",
                              error={"message": str(exc)} if failed else None, quiet=True)
            raise

    async def _one_shot(self, client: OmnigentClient, session_id: str | None, output) -> int:
        import trio

        from protocol import events as ev

        from . import api
        from .stdin import compose

        opts = self.options
        context = None
        if opts.stdin is not None:
            context, note = await opts.stdin.read()
            if note is not None:
                print(note, file=sys.stderr, flush=True)
        text = compose(context, opts.prompt or "")
        if session_id is None:
            session_id = (await client.create_session(opts.bundle, **opts.created_fields()))["id"]
        output.init(session_id)
        if opts.verbose:
            print(f"conversation: {session_id}", file=sys.stderr, flush=True)
        if opts.place is not None:
            await opts.place(client, session_id)

        timeline = ["front.turn_started", "front.first_output"]  # points still to mark
        error: dict[str, Any] | None
        status, error = "lost", {"code": "stream_closed", "message": "the server closed the event stream mid-turn"}
        mark("front.turn_posting")  # the client/ point nearest "turn dispatched" (not ours to edit)
        stream = client.sessions.stream(session_id, heartbeats=True)
        async with stream:
            await stream.__anext__()  # the greeting heartbeat: subscribed before the message goes
            started = trio.current_time()
            # nobody can be asked at a terminal: a call that needs an approval is refused at once
            posted = await api.post_message(client, session_id, text, approval_timeout=0)
            turn_id = posted.get("turn_id")
            async for event in stream:
                if event.type == ev.HEARTBEAT:
                    continue
                if event.turn_id is not None and turn_id is not None and event.turn_id != turn_id:
                    continue
                if event.type == ev.RESPONSE_CREATED and len(timeline) == 2:
                    mark(timeline.pop(0))
                elif event.type in (ev.TEXT_DELTA, ev.ITEM_DONE) and timeline:
                    mark(timeline.pop())  # the first token, or the whole answer when the model sends no deltas
                output.event(event.data)
                if event.type == ev.COMPLETED:
                    status, error = "completed", None
                elif event.type == ev.FAILED:
                    status, error = "failed", event.data.get("error")
                elif event.type == ev.CANCELLED:
                    status, error = "cancelled", None
                if event.is_terminal:
                    break
        code = output.finish(status=status, error=error, duration_ms=(trio.current_time() - started) * 1000)
        mark("front.answer_printed")
        return code
