"""What the user talks to: one-shot `-p` or the REPL, as a client of a server.

It resolves which conversation to use (explicit id, picker, --continue, or a
fresh one created lazily on the first message) and then either runs one turn
and prints the answer, or hands over to the REPL. A resumed conversation runs
the current agent spec: the bundle is uploaded again before anything is sent.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

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

        try:
            if self.options.prompt is not None:
                return await self.one_shot(client, await self.resolve(client, None))
            from .repl import Repl
            from .terminal import history_path, open_input

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
            await client.upload_agent(self.options.bundle, session_id=session_id)  # this session only
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
        if session_id is None:
            session_id = (await client.create_session(self.options.bundle, workspace=self.options.workspace,
                                                      **self.options.session_fields))["id"]
        if self.options.place is not None:
            await self.options.place(client, session_id)
        from protocol import events as ev

        from .render import no_text_notice, retry_notice

        streamed: list[str] = []  # this attempt's text, kept for a stream that drops mid-answer
        timeline = ["front.turn_started", "front.first_output"]  # points still to mark

        def on_event(event: dict) -> None:
            if event["type"] == ev.MODEL_RETRY:
                print(retry_notice(event), file=sys.stderr, flush=True)
            elif event["type"] == ev.RESPONSE_CREATED:
                streamed.clear()
                if len(timeline) == 2:
                    mark(timeline.pop(0))
            elif event["type"] in (ev.TEXT_DELTA, ev.ITEM_DONE) and timeline:
                mark(timeline.pop())  # the first token, or the whole answer when the model sends no deltas
            if event["type"] == ev.TEXT_DELTA:
                streamed.append(event["delta"])

        mark("front.turn_posting")  # the client/ point nearest "turn dispatched" (not ours to edit)
        result = await client.run_turn(session_id, self.options.prompt or "", on_event=on_event)
        if result.status == "completed":
            completed = next((e for e in reversed(result.events) if e["type"] == ev.COMPLETED), None)
            notice = no_text_notice(completed["response"].get("output") or ()) if completed else None
            if notice is not None and not result.text.strip():
                print(notice, file=sys.stderr, flush=True)  # stdout stays empty: no answer text
            else:
                print(result.text, flush=True)
            mark("front.answer_printed")
            return 0
        error = result.error or {}
        if error.get("code") == "stream_dropped" and streamed:
            print("".join(streamed), flush=True)  # the partial answer; the error line says it is one
        print(f"Error: {error.get('message') or result.status}", file=sys.stderr, flush=True)
        return 1
