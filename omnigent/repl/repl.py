"""The interactive REPL of `omnigent run`: a client of a server, nothing more.

One conversation is attached at a time. A live subscription to its event
stream renders whatever happens to it, even between turns; the loop reads a
line, runs it as a slash command or as one turn, and waits for that turn to
end. A fresh conversation is created lazily, on the first message, so merely
opening the REPL stores nothing.

Tool steps show one line per call and per result. On a terminal, a call
that needs an approval is asked (`approvals`), its message posted with no
approval timeout; from a pipe there is nobody to ask, so messages carry an
approval timeout of 0 and such a call is refused at once (one stderr line
says how to allow it).

Exit codes: 0 on Ctrl-D, EOF, /quit or /exit. When stdin is a pipe, 1 if any
turn failed (so scripts notice) and 130 after Ctrl-C, which in a pipe stops
the whole run; on a terminal Ctrl-C only cancels the running turn.
"""

from __future__ import annotations

import shlex
import signal
from dataclasses import dataclass, field
from typing import Any

import trio

from protocol import events as ev

from ..client import OmnigentClient, OmnigentError
from . import api, steps
from .approvals import Approvals
from .commands import Commands
from .console import Console
from .options import FrontOptions
from .render import LiveRenderer, transcript
from .status import total_tokens
from .terminal import PROMPT, LineInput
from .trace import trace

BIND_WAIT = 30.0  # seconds to wait for a runner to come online before the first message



@dataclass
class _Turn:
    turn_id: str | None = None  # known once the server accepted the message
    cancel_requested: bool = False
    before_post: trio.CancelScope = field(default_factory=trio.CancelScope)  # Ctrl-C: send nothing
    done: trio.Event = field(default_factory=trio.Event)


class Repl(Commands):
    def __init__(self, client: OmnigentClient, options: FrontOptions, session_id: str | None,
                 lines: LineInput) -> None:
        self.client = client
        self.options = options
        self.session_id = session_id  # the attached conversation; None until the first message
        self.lines = lines
        self.console = Console(tty=lines.interactive, shown_prompt=lines.shown_prompt,
                               markdown=not options.raw)
        self.renderer = LiveRenderer(self.console, interactive=lines.interactive)
        self.approvals = Approvals(client, self.console, lines, can_answer=self._can_answer())
        self._at_prompt = False  # the terminal reader is showing the input prompt
        self._last_session: str | None = None
        self._bound: str | None = None  # the session whose runner binding was seen to
        self._turn: _Turn | None = None
        self._turn_began = trio.Event()  # set (and renewed) as each turn starts: `_tick` waits for it
        self._outcomes: dict[str, dict[str, Any]] = {}  # terminal events of our turn, by turn id
        self._ended: set[str] = set()  # turns of the attached session seen to end
        self._pump: trio.CancelScope | None = None
        self._main = trio.CancelScope()
        self._quit = False
        self._failed = False
        self._interrupted = False

    async def run(self) -> int:
        with trio.open_signal_receiver(signal.SIGINT) as sigint:  # ours for the REPL's life
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._on_sigint, sigint)
                if self.console.screen:
                    nursery.start_soon(self._tick)
                code = 130  # unless the loop ends by itself: Ctrl-C cancels it in a pipe
                try:
                    with self._main:
                        code = await self._start() or await self._loop()
                finally:
                    nursery.cancel_scope.cancel()
        self._resume_hint()
        return code

    async def _start(self) -> int:
        try:
            if self.session_id is not None:
                await self._attach(self.session_id)
            elif self.console.tty:
                self.console.line(self.console.style.dim(
                    f"{self.options.agent_name} · /help for commands · Ctrl-D to leave"))
        except OmnigentError as exc:
            self.console.error(exc.message)
            return 1
        return 0

    async def _loop(self) -> int:
        while not (self._quit or self._interrupted):
            self.console.end_line()
            if self.lines.interactive and self.options.idle is not None:
                self.options.idle()  # a person types for seconds: the warm spare may start now
            if self.approvals.pending:  # before the prompt, while the reader is free
                await self._join(await self.approvals.answer_pending())
            try:
                self._at_prompt = True
                self.console.before_read()  # the prompt's line, `state: sleeping` below it
                try:
                    typed = await self.lines.read(PROMPT)
                finally:
                    self._at_prompt = False
            except EOFError:
                self.console.after_read(eof=True)  # readline leaves the cursor after the prompt
                break
            self.console.after_read(shown=PROMPT + typed)
            line = typed.strip()
            if not line:
                continue
            try:
                if line.startswith("/"):
                    await self._command(line)
                else:
                    await self._send(line)
            except OmnigentError as exc:
                self._failed = True
                self.console.error(exc.message)
        if self._interrupted:
            return 130
        return 1 if self._failed and not self.lines.interactive else 0

    def _can_answer(self) -> bool:
        return True

    # --- the attached conversation ------------------------------------------

    async def _attach(self, session_id: str, info: dict[str, Any] | None = None) -> None:
        """Follow an existing conversation and print it whole."""
        info = info or await self.client.get_session(session_id)
        trace(f"resuming existing session id={session_id!r}")
        await self._follow(session_id, info["last_sequence_number"])
        items = await self.client.list_items(session_id)
        turns = await self._turns(session_id)
        self.console.line(f"Resumed conversation {session_id}")
        self.console.write(transcript(items, self.console.style, self.renderer.markdown, turns))
        self.renderer.calls.seen(items)
        if turns and turns[-1]["status"] == "interrupted":
            if "step" in turns[-1]:  # a server with the agent loop: it says where
                last = turns[-1]["step"] or {}
                asking = any(r.get("turn_id") == turns[-1].get("id") and r.get("step") == last.get("step")
                             for r in await self.approvals.fetch(session_id))
                where = steps.where_stopped(turns[-1]["step"], asking=asking)
                self.console.notice(f"The last turn was interrupted (omnigent stopped in the middle of it, "
                                    f"{where}); /retry continues from there.")
            else:
                self.console.notice("The last turn was interrupted (omnigent stopped in the middle of it); "
                                    "/retry runs it again.")
        elif turns and turns[-1]["status"] == "cancelled":
            self.console.notice("The last turn was cancelled; /retry runs it again.")
        await self.approvals.refresh(session_id, turns)

    def _detach(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
        self._pump = None
        self.session_id = None
        self.approvals.reset(None)

    async def _follow(self, session_id: str, after: int) -> None:
        self._detach()
        self.session_id = session_id  # before the pump starts, or its first events are dropped
        self.approvals.reset(session_id)
        try:
            self._pump = await self._nursery.start(self._pump_events, session_id, after)
        except OmnigentError:
            self.session_id = None
            raise
        self._last_session = session_id

    async def _pump_events(self, session_id: str, after: int,
                           task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        """Render the session's events for as long as it is attached, reconnecting from `after`."""
        with trio.CancelScope() as scope:
            started, delay = False, 0.5
            while True:
                trace(f"subscribing /stream {session_id}")
                try:
                    async with self.client.events(session_id, after=after) as stream:
                        if not started:
                            task_status.started(scope)
                            started = True
                        delay = 0.5
                        async for event in stream:
                            if event["type"] != ev.HEARTBEAT:
                                after = event.get("sequence_number", after)
                                self._on_event(session_id, event)
                    trace("/stream closed; reconnecting")
                except OmnigentError as exc:
                    if not started:
                        raise
                    trace(f"/stream error: {exc!r}; reconnecting")
                await trio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _on_event(self, session_id: str, event: dict[str, Any]) -> None:
        if session_id != self.session_id:
            return  # a detached conversation's straggler: never show another's text
        self.renderer.event(event)
        if event["type"] == ev.USAGE and self._turn is not None and self._turn.turn_id == event.get("turn_id"):
            self.console.tokens(total_tokens(event.get("turn")))
        if event["type"] == ev.APPROVAL_REQUESTED:
            self.approvals.requested(event, at_prompt=self._at_prompt)
        elif event["type"] == ev.APPROVAL_RESOLVED:
            self.approvals.resolved(event)
        turn = self._turn
        turn_id: Any = event.get("turn_id")
        if event["type"] in ev.TERMINAL_EVENTS and turn_id:
            self._ended.add(turn_id)
        if turn is None or turn.turn_id not in (None, turn_id):
            return
        if event["type"] in ev.TERMINAL_EVENTS:
            self._outcomes[turn_id] = event
            if turn.turn_id == turn_id:
                turn.done.set()
        elif event["type"] == ev.RESPONSE_CREATED and turn.cancel_requested:
            self._nursery.start_soon(self._interrupt)  # it was still queued when Ctrl-C came

    # --- turns ----------------------------------------------------------------

    async def _send(self, text: str | None) -> None:
        """Run one turn: `text` as a new message, or None to retry the last interrupted turn."""
        self._turn_started()
        turn = self._turn = _Turn()
        try:
            if self.session_id is None:
                trace("POST /v1/sessions multipart bundle")
                info = await self.client.create_session(self.options.bundle, **self.options.created_fields())
                trace(f"session created id={info['id']!r}")
                await self._follow(info["id"], info["last_sequence_number"])
            session_id = self.session_id
            assert session_id is not None  # created just above, or resumed
            if self._bound != session_id or self.options.place is not None:  # --server: every turn
                with turn.before_post:
                    await self._bind(session_id)
                    self._bound = session_id
            if turn.cancel_requested:
                self.console.notice("(cancelled)")
                return
            trace(f"POST /events session={session_id}")
            # on a terminal an approval waits for its answer; from a pipe nobody can give one
            timeout = None if self.lines.interactive else 0
            posted = await (api.post_message(self.client, session_id, text, approval_timeout=timeout)
                            if text is not None else api.retry(self.client, session_id, approval_timeout=timeout))
            turn.turn_id = posted["turn_id"]
            trace("POST returned; waiting for terminal event")
            if turn.turn_id in self._outcomes:
                turn.done.set()
            elif turn.cancel_requested:
                self._nursery.start_soon(self._interrupt)
            await self._wait(turn)
            outcome = self._outcomes.pop(turn.turn_id, None)
            if outcome is None:
                self.console.notice("stopped waiting; the turn may still finish")
            elif outcome["type"] == ev.FAILED:
                self._failed = True
        finally:
            self._turn = None
            self._outcomes.clear()
            self.console.turn_ended()
            if self.options.idle is not None:
                self.options.idle()  # the first turn no longer competes with the warm spare

    async def _join(self, turn_ids: list[str]) -> None:
        """Follow turns (another client's) whose approval was just answered here, as if ours, to their end.

        So the next approval they ask is asked here too, and the prompt comes
        back once they are done; Ctrl-C cancels them as it would our own.
        """
        for turn_id in dict.fromkeys(turn_ids):
            if turn_id in self._ended or self.session_id is None:
                continue
            turn = self._turn = _Turn(turn_id=turn_id)
            self._turn_started()
            try:
                await self._wait(turn)
            finally:
                self._turn = None
                self._outcomes.clear()
                self.console.turn_ended()

    async def _wait(self, turn: _Turn) -> None:
        """Until the turn ends, answering its approvals (and any other) as they come."""
        async with trio.open_nursery() as nursery:
            if self.approvals.can_answer:
                nursery.start_soon(self.approvals.keep_answering)
            await turn.done.wait()
            nursery.cancel_scope.cancel()

    async def _bind(self, session_id: str) -> None:
        """Bind an online runner now, so the first answer does not wait for one (and it shows)."""
        if self.options.place is not None:  # --server: the session's host decides
            await self.options.place(self.client, session_id)
            return
        info = await self.client.get_session(session_id)
        if info.get("runner_id") and info.get("runner_online"):
            return
        runner_id = None
        with trio.move_on_after(BIND_WAIT):
            while True:
                pool = await self.client.runner_pool()
                if pool["data"]:
                    runner_id = pool["data"][0]["runner_id"]
                    break
                if pool.get("gave_up"):
                    break  # none will come: the turn itself reports why
                await trio.sleep(0.1)  # no event says "a runner came online"; it is quick
        if runner_id is None:
            return  # the server binds one when it dispatches the turn
        trace(f"PATCH /v1/sessions/{session_id} runner_id={runner_id!r}")
        try:
            bound = await self.client.bind_runner(session_id, runner_id)
        except OmnigentError as exc:  # it went away meanwhile: the server will bind another
            trace(f"PATCH failed: {exc.message}")
            return
        trace(f"runner bound id={bound.get('runner_id')!r}")

    async def _tick(self) -> None:
        """Redraw the running status once a second of the turn: its elapsed time (only a terminal has one).

        Between turns it waits for the next to start: an idle REPL is not woken once a second for it."""
        while True:
            started = self.console.status.started
            if started is None:
                await self._turn_began.wait()
                continue
            await trio.sleep(1.0 - (trio.current_time() - started) % 1.0)
            if self.console.status.started == started:  # still that turn's
                self.console.tick()

    def _turn_started(self) -> None:
        self.console.turn_started()
        self._turn_began.set()
        self._turn_began = trio.Event()

    async def _on_sigint(self, signals: Any) -> None:
        async for _ in signals:
            turn = self._turn
            if not self.lines.interactive:
                self._interrupted = True  # a pipe has nobody to come back to the prompt
                if turn is None:
                    self._main.cancel()
                    continue
            if turn is None:
                continue  # between prompts on a terminal: nothing is running
            if turn.cancel_requested:
                turn.done.set()  # a second Ctrl-C: stop waiting for the server
                continue
            turn.cancel_requested = True
            self.console.interrupted()  # off the line the terminal echoed ^C on
            self.console.notice("cancelling the turn… (Ctrl-C again to stop waiting)")
            turn.before_post.cancel()
            if turn.turn_id is not None:
                await self._interrupt()

    async def _interrupt(self) -> None:
        if self.session_id is None:
            return  # nothing was created yet: nothing to interrupt
        try:
            await self.client.interrupt(self.session_id)
        except OmnigentError as exc:
            self.console.error(exc.message)

    def _resume_hint(self) -> None:
        if self._last_session is not None and not self.options.ephemeral:
            self.console.line(f"Resume this conversation with: omnigent run "
                              f"{shlex.quote(self.options.agent_path)} --resume {self._last_session}",
                              err=True)
