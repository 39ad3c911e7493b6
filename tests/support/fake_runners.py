"""Fake runner processes and an in-process server + host, for deterministic recovery tests.

Everything here runs under `trio.testing.MockClock(autojump_threshold=0)`:
no sockets, no subprocesses, no hypercorn. The pieces under test are real:
`Store`, `EventHub`, `RunnerRegistry`, `TurnService`, `serve_runner`, the
host `Host` with its `Supervisor`, and the host<->server `memory_link`.
Only the runner processes are fake:

- `FakeRunnerLauncher` is a `supervisor.Launcher`. Each launch returns a
  `FakeRunnerProcess` and starts, in the harness nursery, both ends of an
  in-memory "websocket": the server's real `serve_runner` on one end and a
  scripted fake runner speaking the runner protocol on the other.
- What the n-th launched process does is its `RunnerScript` (fail to start,
  or answer / die / hang / duplicate per turn), so a test can say "the first
  runner dies mid-turn, the second answers".
- Killing a fake process (a signal from the supervisor, or `kill()` from a
  test: an external `kill -9`) ends the fake runner and drops its connection,
  like a real process dying; `wait()` then returns `-signal`.
"""

from __future__ import annotations

import dataclasses
import math
import random
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import trio
import trio.testing

import protocol as p
from omnigent.host.pool import Host
from omnigent.link.memory import LinkEnd, memory_link
from omnigent.runner.history_cache import HistoryCache
from omnigent.server.hub import EventHub
from omnigent.server.registry import RunnerRegistry
from omnigent.server.runner_link import serve_runner
from omnigent.server.serve import _consume_host
from omnigent.server.state import ServerState
from omnigent.server.turns import TurnService
from omnigent.store import Store
from omnigent.store.owners import ClaimOwner
from protocol import events as ev
from protocol.history import HISTORY_CACHE
from supervisor import Event, RestartPolicy, Supervisor

SIGKILL, SIGTERM = int(signal.SIGKILL), int(signal.SIGTERM)

# base 0.5 s, doubling, no jitter: restart delays 0.5, 1, 2, ...; a 4th exit within 10 s gives up
TEST_POLICY = RestartPolicy(base=0.5, factor=2, cap=10, jitter=0, reset_after=30, intensity=3, period=10)


# --- scripts -------------------------------------------------------------------


@dataclass(frozen=True)
class TurnScript:
    """What a fake runner does with one TurnStart, in virtual seconds from receiving it.

    - "answer": after `after` s, one text delta with `text`, then TurnCompleted.
    - "duplicate": like answer, then a second TurnCompleted with `duplicate_text`.
    - "die": a delta with `partial` (if any) at once; after `after` s the process
      ends with `returncode` (negative: killed by that signal) and the connection drops.
    - "hang": after `after` s stop answering anything (pings included), forever.
    - "fail": a delta with `partial` (if any) at once; after `after` s a TurnFailed
      with `code` and `message`, as a runner whose model call failed sends it.
    - "exit_linger": like die, but the connection outlives the process by
      `linger` s (as if held outside its process group, so the supervisor's
      group SIGKILL after the exit misses it), then the dead attempt sends a
      late TurnCompleted with `text`.
    """

    action: str = "answer"
    after: float = 1.0
    text: str = "Hello!"
    partial: str = ""
    returncode: int = -SIGKILL
    duplicate_text: str = "Hello again (duplicate)"
    linger: float = 0.0
    code: str = "model_error"
    message: str = "the fake model failed"
    # "answer" with calls: the output also holds these function calls, (name, JSON arguments) each
    calls: tuple[tuple[str, str], ...] = ()
    die_after: bool = False   # "answer": killed right after sending its answer (see _die_soon)


@dataclass(frozen=True)
class ToolScript:
    """What a fake runner does with one ToolStart (preview ones are answered at once with a diff).

    - "result": after `after` s, a `session.tool.output` event with `output` (if any), then
      ToolResult(`status`, `output`).
    - "die": the output event with `partial` (if any) at once; after `after` s the process ends
      with `returncode`, like a runner SIGKILLed mid-tool.
    - "hang": after `after` s stop answering anything, forever.
    - "wait": stream `partial` and run until cancelled (a long `sleep`).
    """

    action: str = "result"
    after: float = 1.0
    output: str = "ok"
    status: str = "completed"
    partial: str = ""
    returncode: int = -SIGKILL
    die_after: bool = False   # "result": killed right after sending the result (see _die_soon)


@dataclass(frozen=True)
class RunnerScript:
    """How one launched process behaves; its turns use `turns[i]`, then `default_turn`."""

    turns: tuple[TurnScript, ...] = ()
    default_turn: TurnScript = TurnScript()
    tools: tuple[ToolScript, ...] = ()       # the n-th ToolStart it gets (previews not counted)
    default_tool: ToolScript = ToolScript()
    start_exit: int | None = None       # exit with this code before saying hello
    start_exit_after: float = 0.0
    log_line: str = ""                   # written to its log before it exits at start
    hello_after: float = 0.0
    hang_after: float | None = None      # stop answering anything this long after hello, busy or not
    # announce "history_cache" and keep histories in the runner's real cache of this many bytes
    # (0: nothing fits, every incremental step misses); None: a runner that does not announce it
    history_cache: int | None = None
    # an `output_item.done` event for each item of an answer before its TurnCompleted, as a real runner
    item_events: bool = False
    # announce "items_in_completed": acknowledged, the items come in the TurnCompleted only (`unannounced`);
    # not acknowledged, as `item_events`
    fold_items: bool = False

    def turn(self, index: int) -> TurnScript:
        return self.turns[index] if index < len(self.turns) else self.default_turn

    def tool(self, index: int) -> ToolScript:
        return self.tools[index] if index < len(self.tools) else self.default_tool


def another_process() -> ClaimOwner:
    """A claimant standing for another live omnigent process (it is this one, with its own token):
    what a second server or `omnigent run` sharing the store would hold."""
    me = ClaimOwner.this_process()
    return ClaimOwner(me.pid, me.started, token="another-process")


def answers(text: str = "Hello!", after: float = 1.0) -> RunnerScript:
    return RunnerScript(default_turn=TurnScript("answer", after=after, text=text))


def dies_mid_turn(after: float = 1.0, returncode: int = -SIGKILL, partial: str = "") -> RunnerScript:
    return RunnerScript(turns=(TurnScript("die", after=after, returncode=returncode, partial=partial),))


def hangs_mid_turn(after: float = 0.0) -> RunnerScript:
    return RunnerScript(turns=(TurnScript("hang", after=after),))


def fails_to_start(code: int = 3, line: str = "cannot start", after: float = 0.0) -> RunnerScript:
    return RunnerScript(start_exit=code, start_exit_after=after, log_line=line)


def fails_turn(code: str = "model_error", message: str = "the fake model failed", after: float = 1.0) -> RunnerScript:
    return RunnerScript(turns=(TurnScript("fail", after=after, code=code, message=message),))


def assistant_item(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text}]}


def call_id_for(start: p.TurnStart, index: int) -> str:
    """The call id a fake gives the `index`-th call of a model step (the same on a repeat)."""
    return f"call_{start.turn_id[-6:]}_{start.step}_{index}"


def function_call_item(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
            "arguments": arguments, "status": "completed"}


def calls(*pairs: tuple[str, str], text: str = "", after: float = 1.0) -> TurnScript:
    """A model step answering with these tool calls (and `text`, if any)."""
    return TurnScript("answer", after=after, text=text, calls=tuple(pairs))


# --- the fake process and its connection ------------------------------------------


class MemoryTransport:
    """The server's side of a fake runner's websocket (a `runner_link.Transport`).

    Text frames over unbounded memory channels. When the peer is gone,
    `receive` and `send` raise ConnectionError, as the websocket route's would.
    """

    def __init__(self, send: trio.MemorySendChannel[str], receive: trio.MemoryReceiveChannel[str]) -> None:
        self._send = send
        self._receive = receive
        self.close_code: int | None = None
        self.close_reason: str | None = None

    async def receive(self) -> str:
        try:
            return await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError, trio.BrokenResourceError):
            raise ConnectionError("runner connection lost") from None

    async def send(self, text: str) -> None:
        try:
            self._send.send_nowait(text)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ConnectionError("runner connection lost") from None
        await trio.lowlevel.checkpoint()

    async def close(self, code: int, reason: str) -> None:
        if self.close_code is None:
            self.close_code, self.close_reason = code, reason
        self._send.close()  # the runner reads the end of the stream
        await trio.lowlevel.checkpoint()

    def abort(self) -> None:
        """The route returned: both directions are gone."""
        self._send.close()
        self._receive.close()


class FakeRunnerProcess:
    """A `supervisor.ProcessHandle` whose "process" is a scripted task speaking the runner protocol."""

    def __init__(self, index: int, runner_id: str, script: RunnerScript, log_path: Path) -> None:
        self.index = index
        self.pid = 1000 + index
        self.runner_id = runner_id
        self.script = script
        self.log_path = log_path
        self.launched_at = trio.current_time()
        self.returncode: int | None = None
        self.exited_at: float | None = None
        self.signals: list[tuple[float, int]] = []
        self.stdin_closed_at: float | None = None
        self.hung = False
        self.lingering = False  # the connection outlives the process (see TurnScript "exit_linger")
        self.turns_received: list[tuple[float, p.TurnStart]] = []  # with the whole history (as the harness gets it)
        self.raw_turns: list[p.TurnStart] = []  # as they came (history_from > 0: only the new items)
        self.history = HistoryCache(script.history_cache) if script.history_cache is not None else None
        self.folds = False  # the server acknowledged items_in_completed (RunnerScript.fold_items)
        self.tools_received: list[tuple[float, p.ToolStart]] = []  # previews included
        self._running_tools: dict[str, tuple[str, trio.CancelScope, list[str]]] = {}  # turn -> (call, scope, out)
        self.sent: list[tuple[float, p.Frame]] = []
        self.late_delivered: bool | None = None  # exit_linger: did the late completion get through?
        self.server_outcome: str | None = None   # how serve_runner ended for this connection
        self.reaped = False  # someone awaited wait() after it exited (the supervisor reaps its children)
        self.hung_at: float | None = None  # when it stopped answering while still alive
        self._exited = trio.Event()
        self._scope = trio.CancelScope()
        to_server, from_runner = trio.open_memory_channel[str](math.inf)
        to_runner, from_server = trio.open_memory_channel[str](math.inf)
        self.transport = MemoryTransport(to_runner, from_runner)
        self._out = to_server
        self._in = from_server

    # --- ProcessHandle ------------------------------------------------------------

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        self.reaped = True
        return self.returncode

    def send_signal_group(self, sig: int) -> None:
        self.signals.append((trio.current_time(), int(sig)))
        if int(sig) in (SIGKILL, SIGTERM):
            self._die(-int(sig))

    def close_stdin(self) -> None:
        if self.stdin_closed_at is None:
            self.stdin_closed_at = trio.current_time()

    # --- for tests ----------------------------------------------------------------

    def kill(self, sig: int = SIGKILL) -> None:
        """An external `kill -SIG` of the process (not through the supervisor)."""
        self.send_signal_group(sig)

    @property
    def alive(self) -> bool:
        return self.returncode is None

    # --- the fake process's life -----------------------------------------------------

    def _die(self, returncode: int) -> None:
        if self.returncode is None:
            self.returncode = returncode
            self.exited_at = trio.current_time()
            self._stop_answering()  # a dead process answers nothing, even if its socket lingers
            self._exited.set()
        if not self.lingering:
            self._drop()

    def _stop_answering(self) -> None:
        if not self.hung:
            self.hung = True
            if self.returncode is None:
                self.hung_at = trio.current_time()

    async def _hang_later(self, after: float) -> None:
        await trio.sleep(after)
        self._stop_answering()

    def _drop(self) -> None:
        self._scope.cancel()
        self._out.close()  # the server reads the end of the stream
        self._in.close()   # and its sends fail

    def _send(self, frame: p.Frame) -> None:
        self._out.send_nowait(p.encode(frame))
        self.sent.append((trio.current_time(), frame))

    async def exit_early(self) -> None:
        """Fails to start: exits before it ever says hello."""
        await trio.sleep(self.script.start_exit_after)
        assert self.script.start_exit is not None
        self._die(self.script.start_exit)

    async def run(self) -> None:
        """The runner side: hello, then pings and turns until it dies or the server closes."""
        with self._scope:
            try:
                await trio.sleep(self.script.hello_after)
                self._send(p.Hello(runner_id=self.runner_id, pid=self.pid,
                                   protocol_version=p.PROTOCOL_VERSION, harnesses=["fake"],
                                   features=([HISTORY_CACHE] if self.history is not None else [])
                                   + ([p.ITEMS_IN_COMPLETED] if self.script.fold_items else [])))
                ack = p.decode(await self._in.receive())
                if not isinstance(ack, p.HelloAck):
                    raise AssertionError(f"expected hello.ack, got {ack!r}")
                self.folds = p.ITEMS_IN_COMPLETED in ack.features
                count = tool_count = 0
                async with trio.open_nursery() as turns:
                    if self.script.hang_after is not None:
                        turns.start_soon(self._hang_later, self.script.hang_after)
                    async for raw in self._in:
                        while self.hung:
                            await trio.sleep_forever()
                        frame = p.decode(raw)
                        if isinstance(frame, p.Ping):
                            self._send(p.Pong(ts=frame.ts))
                        elif isinstance(frame, p.TurnStart):
                            self.raw_turns.append(frame)
                            frame = self._whole_history(frame)
                            if frame is None:
                                continue
                            turns.start_soon(self._turn, frame, self.script.turn(count))
                            count += 1
                        elif isinstance(frame, p.ToolStart):
                            self.tools_received.append((trio.current_time(), frame))
                            if frame.approval == "preview":
                                self._send(p.ToolResult(frame.turn_id, frame.call_id, "preview",
                                                        f"--- a/{frame.name}\n+++ b/{frame.name}\n"))
                                continue
                            turns.start_soon(self._tool, frame, self.script.tool(tool_count))
                            tool_count += 1
                        elif isinstance(frame, p.Cancel):
                            running = self._running_tools.pop(frame.turn_id, None)
                            if running is not None:
                                call_id, scope, out = running
                                scope.cancel()
                                self._send(p.ToolResult(frame.turn_id, call_id, "cancelled",
                                                        "cancelled by the user. Output so far:\n" + "".join(out)))
                            else:
                                self._send(p.TurnFailed(frame.turn_id, "cancelled", "cancelled"))
                    turns.cancel_scope.cancel()
                self._die(0)  # the server closed the connection: a real runner exits 0
            except* (trio.ClosedResourceError, trio.BrokenResourceError, trio.EndOfChannel):
                pass  # its connection was cut while it was dying

    def _whole_history(self, start: p.TurnStart) -> p.TurnStart | None:
        """What the real runner does (runner/turns.py): the whole history, or HistoryMiss."""
        if self.history is None:
            assert not start.history_from, "an incremental history for a runner that never asked for one"
            return start
        full = self.history.whole(start)
        if full is None:
            self._send(p.HistoryMiss(start.turn_id, start.attempt, start.step))
            return None
        return dataclasses.replace(full, input=list(full.input))

    async def _turn(self, start: p.TurnStart, script: TurnScript) -> None:
        self.turns_received.append((trio.current_time(), start))
        turn_id = start.turn_id
        if script.action in ("answer", "duplicate"):
            await trio.sleep(script.after)
            await self._unless_hung()
            output = [assistant_item(script.text)] if script.text or not script.calls else []
            if output:
                self._send(p.TurnEvent(turn_id, {"type": ev.TEXT_DELTA, "turn_id": turn_id, "delta": script.text}))
            output += [function_call_item(call_id_for(start, i), name, args)
                       for i, (name, args) in enumerate(script.calls)]
            suffix = f"_{start.step}" if start.step else ""  # step 0 keeps the id older tests know
            if (self.script.item_events or self.script.fold_items) and not self.folds:
                for item in output:
                    self._send(p.TurnEvent(turn_id, ev.make_event(ev.ITEM_DONE, turn_id=turn_id, item=item)))
            self._send(p.TurnCompleted(turn_id, f"resp_{self.pid}_{turn_id[-6:]}{suffix}", output,
                                       {"total_tokens": 3}, unannounced=len(output) if self.folds else 0))
            if script.die_after:
                await self._die_soon(script.returncode)
                return
            if script.action == "duplicate":
                self._send(p.TurnCompleted(turn_id, f"resp_{self.pid}_dup",
                                           [assistant_item(script.duplicate_text)], None))
        elif script.action in ("die", "exit_linger"):
            if script.partial:
                self._send(p.TurnEvent(turn_id, {"type": ev.TEXT_DELTA, "turn_id": turn_id,
                                                 "delta": script.partial}))
            await trio.sleep(script.after)
            if script.action == "die":
                self._die(script.returncode)
                return
            self.lingering = True
            self._die(script.returncode)
            await trio.sleep(script.linger)
            self.lingering = False
            try:
                self._send(p.TurnCompleted(turn_id, f"resp_{self.pid}_late", [assistant_item(script.text)]))
                self.late_delivered = True
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                self.late_delivered = False
            self._drop()
        elif script.action == "fail":
            if script.partial:
                self._send(p.TurnEvent(turn_id, {"type": ev.TEXT_DELTA, "turn_id": turn_id,
                                                 "delta": script.partial}))
            await trio.sleep(script.after)
            await self._unless_hung()
            self._send(p.TurnFailed(turn_id, script.code, script.message))
        elif script.action == "hang":
            await trio.sleep(script.after)
            self._stop_answering()
            await trio.sleep_forever()
        else:
            raise ValueError(f"unknown turn action {script.action!r}")


    async def _tool(self, start: p.ToolStart, script: ToolScript) -> None:
        turn_id, call_id = start.turn_id, start.call_id
        out: list[str] = []

        def stream(text: str) -> None:
            out.append(text)
            self._send(p.TurnEvent(turn_id, {"type": ev.TOOL_OUTPUT, "turn_id": turn_id, "call_id": call_id,
                                             "delta": text}))

        with trio.CancelScope() as scope:
            self._running_tools[turn_id] = (call_id, scope, out)
            if script.action == "result":
                await trio.sleep(script.after)
                await self._unless_hung()
                if script.output:
                    stream(script.output)
                self._running_tools.pop(turn_id, None)
                self._send(p.ToolResult(turn_id, call_id, script.status, script.output))
                if script.die_after:
                    await self._die_soon(script.returncode)
            elif script.action == "die":
                if script.partial:
                    stream(script.partial)
                await trio.sleep(script.after)
                self._die(script.returncode)
            elif script.action == "hang":
                await trio.sleep(script.after)
                self._stop_answering()
                await trio.sleep_forever()
            elif script.action == "wait":
                if script.partial:
                    stream(script.partial)
                await trio.sleep_forever()
            else:
                raise ValueError(f"unknown tool action {script.action!r}")

    async def _die_soon(self, returncode: int) -> None:
        """Killed right after its last frame left: it takes nothing more, and is gone 0.5 s later
        (so the server has read that frame before the host reports the exit)."""
        self._stop_answering()
        await trio.sleep(0.5)
        self._die(returncode)

    async def _unless_hung(self) -> None:
        """A hung (or dead) process sends nothing more: its turn task stops here."""
        if self.hung:
            await trio.sleep_forever()


class FakeRunnerLauncher:
    """A `supervisor.Launcher` of `FakeRunnerProcess`es, each served by the real `serve_runner`.

    `scripts[n]` scripts the n-th launch (from 0); later launches use `default`.
    """

    def __init__(
        self,
        state: ServerState,
        nursery: trio.Nursery,
        scripts: Sequence[RunnerScript] | Callable[[int], RunnerScript] = (),
        default: RunnerScript = RunnerScript(),
    ) -> None:
        self.state = state
        self.nursery = nursery
        self.scripts = scripts
        self.default = default
        self.processes: list[FakeRunnerProcess] = []

    def script_for(self, index: int) -> RunnerScript:
        if callable(self.scripts):
            return self.scripts(index)
        return self.scripts[index] if index < len(self.scripts) else self.default

    async def launch(self, argv, *, env, cwd, log_path) -> FakeRunnerProcess:
        index = len(self.processes)
        script = self.script_for(index)
        runner_id = env["OMNIGENT_RUNNER_ID"]
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a") as log:
            log.write(f"fake runner #{index} {runner_id} starting\n")
            if script.log_line:
                log.write(script.log_line + "\n")
        process = FakeRunnerProcess(index, runner_id, script, log_path)
        process.secret = env["OMNIGENT_RUNNER_TOKEN"]  # the secret its host minted for it
        self.processes.append(process)
        if script.start_exit is not None:
            self.nursery.start_soon(process.exit_early, name=f"fake-runner-{index}")
        else:
            self.nursery.start_soon(self._serve, process, name=f"serve-runner-{index}")
            self.nursery.start_soon(process.run, name=f"fake-runner-{index}")
        await trio.lowlevel.checkpoint()
        return process

    async def _serve(self, process: FakeRunnerProcess) -> None:
        """What the runner websocket route does: serve_runner, then the socket is gone."""
        try:
            await serve_runner(self.state, process.runner_id, process.transport, process.secret)
            process.server_outcome = "returned"
        except* ConnectionError:
            process.server_outcome = "connection lost"  # quart would just end the handler
        finally:
            process.transport.abort()

    def by_id(self, runner_id: str) -> FakeRunnerProcess:
        return next(proc for proc in self.processes if proc.runner_id == runner_id)


# --- the client's view ------------------------------------------------------------------


class Seen(NamedTuple):
    """One session event and the virtual time a follower got it."""

    time: float
    event: dict[str, Any]

    @property
    def type(self) -> str:
        return self.event["type"]


def post_message(state: ServerState, session_id: str, text: str,
                 approval_timeout: float | None = None) -> dict[str, Any]:
    """What `POST /v1/sessions/<id>/events` with a user message does (`TurnService.queue_message`,
    then `submit`); returns the turn row. `approval_timeout` None waits until answered, as the
    route stores it when a client sends null."""
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    _item, turn = state.turns.queue_message(session_id, user, approval_timeout=approval_timeout)
    state.turns.submit(session_id)
    return turn


async def collect_until_terminal(hub: EventHub, session_id: str, turn_id: str, after: int = 0) -> list[Seen]:
    """Follow a session's events from `after` until the terminal event of `turn_id`."""
    seen: list[Seen] = []
    async for event in hub.follow(session_id, after=after):
        seen.append(Seen(trio.current_time(), event))
        if event["type"] in p.TERMINAL_EVENTS and event.get("turn_id") == turn_id:
            return seen
    raise AssertionError("the hub closed before the turn ended")


class SessionWatch:
    """Records every event of one session from its first, with the virtual time it came."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.changed = trio.Event()

    async def run(self, hub: EventHub, session_id: str) -> None:
        async for event in hub.follow(session_id, after=0):
            self.seen.append(Seen(trio.current_time(), event))
            self.changed.set()
            self.changed = trio.Event()

    async def until_terminal(self, turn_id: str) -> list[Seen]:
        while not any(s.type in p.TERMINAL_EVENTS and s.event.get("turn_id") == turn_id for s in self.seen):
            await self.changed.wait()
        return list(self.seen)


# --- the harness ------------------------------------------------------------------


@dataclass
class Harness:
    tmp_path: Path
    store: Store
    hub: EventHub
    registry: RunnerRegistry
    turns: TurnService
    state: ServerState
    host: Host
    launcher: FakeRunnerLauncher
    nursery: trio.Nursery
    server_end: LinkEnd
    host_end: LinkEnd
    supervisor_events: list[Event] = field(default_factory=list)
    watches: dict[str, SessionWatch] = field(default_factory=dict)

    @property
    def processes(self) -> list[FakeRunnerProcess]:
        return self.launcher.processes

    def new_session(self, agent: str = "helper", model: str = "fake-model", *, spec: dict | None = None,
                    workspace: str | None = None, permission_mode: str | None = None) -> str:
        """A session of agent `agent`; `spec` adds to its spec (tools, permissions, max_steps ...)."""
        agent_row = self.store.upsert_agent(agent, {"name": agent, "model": model, **(spec or {})})
        session_id = self.store.create_conversation(agent_id=agent_row["id"], workspace=workspace,
                                                    permission_mode=permission_mode)["id"]
        watch = self.watches[session_id] = SessionWatch()
        self.nursery.start_soon(watch.run, self.hub, session_id)
        return session_id

    def post(self, session_id: str, text: str, approval_timeout: float | None = None) -> dict[str, Any]:
        return post_message(self.state, session_id, text, approval_timeout)

    def model_steps(self) -> list[tuple[int, int, int]]:
        """Every TurnStart any runner got: (process index, step, attempt), in order of receipt."""
        got = [(t, proc.index, start.step, start.attempt) for proc in self.processes
               for t, start in proc.turns_received]
        return [g[1:] for g in sorted(got, key=lambda g: g[0])]

    def tool_starts(self, *, previews: bool = False) -> list[tuple[int, int, str, str]]:
        """Every ToolStart any runner got: (process index, step, tool, approval), in order of receipt."""
        got = [(t, proc.index, start.step, start.name, start.approval) for proc in self.processes
               for t, start in proc.tools_received if previews or start.approval != "preview"]
        return [g[1:] for g in sorted(got, key=lambda g: g[0])]

    async def until_terminal(self, session_id: str, turn_id: str) -> list[Seen]:
        return await self.watches[session_id].until_terminal(turn_id)

    async def until(self, predicate: Callable[[], bool]) -> None:
        """Wait until a condition on the server's registry holds (re-checked on every change)."""
        while not predicate():
            await self.registry.wait_changed()

    async def settle(self) -> None:
        """Let every task run until all wait (no virtual time passes)."""
        await trio.testing.wait_all_tasks_blocked()

    async def online(self, count: int = 1) -> list[str]:
        await self.until(lambda: len(self.registry.online) >= count)
        return list(self.registry.online)

    def sup(self, *kinds: str) -> list[Event]:
        return [e for e in self.supervisor_events if not kinds or e.kind in kinds]


async def _record(channel: trio.MemoryReceiveChannel[Event], into: list[Event]) -> None:
    async for event in channel:
        into.append(event)


@asynccontextmanager
async def open_harness(
    tmp_path: Path,
    scripts: Sequence[RunnerScript] | Callable[[int], RunnerScript] = (),
    *,
    default: RunnerScript = RunnerScript(),
    runners: int = 1,
    spares: int = 0,
    policy: RestartPolicy = TEST_POLICY,
    runner_wait: float = 30.0,
    max_attempts: int = 2,
    ping_interval: float = 1.0,
    ping_allowance: float = 3.0,
    startup_timeout: float | None = None,
    rng: random.Random | None = None,
    store_path: str | Path | None = None,
    store_clock: Callable[[], float] | None = None,
    local_permissions: str | None = None,
    stored_events: bool = False,
) -> AsyncIterator[Harness]:
    """The server pieces and a real `Host` over fake runners, in one nursery (ended on exit).

    For seeded runs (tests/sim): `rng` draws the supervisor's jitter, `store_clock`
    stamps the store's rows, `store_path` may be ":memory:"; `startup_timeout`
    is the host's allowance for a hello (its default when None). `stored_events`: the hub
    stores the events (in `store`) and batches as a server's does (`EventHub.run`).
    """
    store = Store(tmp_path / "chat.db" if store_path is None else store_path,
                  **({} if store_clock is None else {"clock": store_clock}))
    try:
        async with trio.open_nursery() as nursery:
            hub = EventHub(store) if stored_events else EventHub()
            if stored_events:
                await nursery.start(hub.run)
            registry = RunnerRegistry()
            registry.local_permissions = local_permissions  # None: the session's own mode (a local run)
            turns = TurnService(store, hub, registry, nursery, runner_wait=runner_wait,
                                max_attempts=max_attempts)
            state = ServerState(store, hub, registry, turns, "t",
                                ping_interval=ping_interval, ping_allowance=ping_allowance)
            server_end, host_end = memory_link()
            state.host_events.links.append(server_end)   # as serve.run_server wires a host link
            nursery.start_soon(_consume_host, state, server_end)
            launcher = FakeRunnerLauncher(state, nursery, scripts, default)
            host = Host("mem://", host_end, log_dir=tmp_path / "logs", workspace=str(tmp_path),
                        runners=runners, env={}, policy=policy, launcher=launcher, spares=spares)
            harness = Harness(tmp_path, store, hub, registry, turns, state, host, launcher, nursery,
                              server_end, host_end)
            if rng is not None:
                host.supervisor = Supervisor(policy, name="host", rng=rng)
            if startup_timeout is not None:
                host.startup_timeout = startup_timeout
            nursery.start_soon(_record, host.supervisor.subscribe(), harness.supervisor_events)
            nursery.start_soon(host.run)  # not start(): a host that gives up never reports started
            yield harness
            nursery.cancel_scope.cancel()
    finally:
        store.close()
