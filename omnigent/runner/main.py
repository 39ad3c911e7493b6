"""The runner process: dial the server, say hello, serve turns until told to stop.

A runner holds no durable state; each TurnStart carries everything it needs
(or only the new items of a history its cache holds: turns.py, history_cache.py).
What this module owns is the process's lifetime: connecting (with patience
while the server starts), the frame loop, and exiting promptly and cleanly
when stdin reaches EOF (a dead supervisor leaves no orphan, G9) or on
SIGTERM. The turns themselves (one task per step with its own cancel scope,
what is still owed an end) are `turns.py`'s; a model step goes to the
harness, a tool step to `tool_steps.py`.

Tools: the runner makes itself a child subreaper (`PR_SET_CHILD_SUBREAPER`)
before it dials, so a tool's daemonised grandchildren (`cmd &`, `nohup`, a
double fork) are reparented to it rather than to init, and it sweeps them
(`sweep_orphans`) whenever no tool runs and once more at exit.

A dropped websocket does not end a runner: its turns go on (the model's
stream with them), their frames wait in the outbox, and it dials the same
URL again with the same id and secret (`redial.py`: capped backoff with
jitter), reporting the turns it still owes an end for in its hello
(`in_flight`), so a restarted server can adopt them. Only a refusal ends it:
4003 (its secret is no longer accepted; the host replaces it) or a protocol
error.

Top-level imports stay at trio, trio_websocket, protocol and the standard
library. openai (via `harness`, ~0.3-0.5 s, seconds under load) is imported
and the first client built in a worker thread that starts before anything
else, while stdin and signals are already watched (a runner whose parent
dies mid-import still exits at once: the thread is abandoned). The dial
(TCP, the websocket upgrade, waiting for a server still starting) overlaps
that import; the hello waits for it (at most PREWARM_WAIT, inside the
server's hello timeout), so "online" still means ready for a turn at once
(stack-notes §5, G14) and a warm spare is warm. A turn that arrives before
the import is done anyway waits for it (`_load_harness`).

An early runner (`omnigent.tree.early`, `OMNIGENT_RUNNER_IDENTITY_FD` set)
is spawned by the CLI before its host exists: it starts importing at once
and reads its identity (the environment its host gives a runner, and its
log path) from that pipe before it dials. EOF with nothing on the pipe
means it was not needed: it exits 0.

Staying responsive: pongs are sent from the receive loop straight to the
socket, not queued behind turn events, and nothing heavy runs on the loop
(the openai import, and decoding or encoding large frames, run in a worker
thread), so a runner busy with turns on a loaded machine still answers pings
and is not killed as hung.
"""

from __future__ import annotations

import json
import os
import random
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    HandshakeError,
    WebSocketConnection,
    open_websocket_url,
)

from protocol import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    Cancel,
    Frame,
    Hello,
    HelloAck,
    Ping,
    Pong,
    ProtocolError,
    ToolStart,
    TurnCompleted,
    TurnFailed,
    TurnStart,
    decode,
    encode,
)

from ..config.timeline import mark
from ._log import log, one_line
from .config import Config, ConfigError, load_config  # noqa: F401  (their home before)
from .redial import FATAL, REFUSED, Backoff
from .tool_steps import ToolSlots, cancelled_result
from .turns import Emit, Start, Turns
from .watch import _watch_signals, _watch_stdin

# Must match harness.HARNESSES (a unit test checks), without importing openai.
HARNESSES = ["openai-agents", "openai-chat"]

CONNECT_TIMEOUT = 5.0      # one attempt (G2: the 60 s default is far too long)
DISCONNECT_TIMEOUT = 2.0
CONNECT_PATIENCE = 30.0    # the server may still be starting
HELLO_TIMEOUT = 10.0
PREWARM_WAIT = 8.0         # a dialed connection waits this long for the import (the server: 10 s for a hello)
THREAD_CODEC_BYTES = 64 * 1024  # frames larger than this are decoded/encoded off the loop
EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
IDENTITY_FD_VAR = "OMNIGENT_RUNNER_IDENTITY_FD"  # tree.early's pipe
_PENDING = Config("http://pending.invalid", "pending", "")  # an early runner's, until its identity comes


class Runner:
    """The runner's state across connections: its turns, the frames they send, the clients.

    Turns outlive a connection (`turns.py`): they put their frames in one
    outbox that the current connection's send loop drains, and the frame
    whose send failed is sent first on the next connection, so the server
    sees every frame of an adopted turn.
    """

    def __init__(self, config: Config, environ: Mapping[str, str] = os.environ, *,
                 dial: Callable[..., Any] | None = None, rng: random.Random | None = None) -> None:
        self.config = config
        self.environ = environ
        self.exit_code = EXIT_OK
        self.stopping = False
        # What `request_stop` cancels: the connect loop, then the session.
        self._active = trio.CancelScope()
        self._turns = Turns(self._execute, self._cancelled_tool)
        self._tools = ToolSlots()
        self._secrets: list[str] | None = None  # known once the tools package is loaded
        self._unsent: tuple[Frame, Any] | None = None  # its send failed: first on the next connection
        self._dial = dial or _dial_websocket
        self._backoff = Backoff(rng=rng)
        self._harness: ModuleType | None = None
        self._pool: Any = None
        self._prewarm_scope = trio.CancelScope()
        self._prewarmed = trio.Event()  # the prewarm thread is done (or failed, or was abandoned)
        self._prewarming = False

    # --- lifetime -------------------------------------------------------

    def request_stop(self, why: str) -> None:
        if not self.stopping:
            log(f"stopping: {why}")
        self.stopping = True
        self._active.cancel()
        self._prewarm_scope.cancel()

    def _stoppable(self) -> trio.CancelScope:
        """A fresh scope for the next phase that `request_stop` cancels (at once if already stopping)."""
        self._active = trio.CancelScope()
        if self.stopping:
            self._active.cancel()
        return self._active

    async def connect_and_serve(self) -> int:
        """Dial, serve, and dial again after a drop, until stopped or refused; the exit code."""
        async with trio.open_nursery() as turns:
            self._turns.nursery = turns
            try:
                return await self._connect_loop()
            finally:
                turns.cancel_scope.cancel()

    async def _connect_loop(self) -> int:
        outer = self._stoppable()
        deadline = trio.current_time() + CONNECT_PATIENCE  # only until the first hello.ack
        connected_once = False
        attempts = 0
        headers = [(b"authorization", f"Bearer {self.config.token}".encode())]
        with outer:
            while True:
                self._active = outer  # between connections, stopping cancels the wait
                attempts += 1
                outcome = "unreachable"
                why = ""
                try:
                    async with self._dial(self.config.ws_url, headers) as ws:
                        outcome = await self._serve(ws)
                except HandshakeError as exc:
                    if outcome == "unreachable":
                        if isinstance(exc, ConnectionRejected) and exc.status_code < 500:
                            log(f"server refused the runner websocket: HTTP {exc.status_code}")
                            return EXIT_ERROR
                        why = _why(exc)
                    # else: closing timed out after the session ended; its outcome stands
                self._active = outer
                if self.stopping or outcome == "stop":
                    return self.exit_code
                if outcome in ("refused", "error"):
                    return EXIT_ERROR
                if outcome == "served":
                    connected_once = True
                    self._backoff.reset()
                    attempts = 0
                delay = self._backoff.next()
                if outcome == "unreachable":
                    if not connected_once and trio.current_time() + delay > deadline:
                        log(f"giving up: server unreachable for {CONNECT_PATIENCE:.0f} s "
                            f"after {attempts} attempts ({why})")
                        return EXIT_ERROR
                    if attempts == 1:
                        state = "yet" if not connected_once else "again"
                        log(f"server not reachable {state} at {self.config.ws_url} ({why}); retrying"
                            + (f" with {len(self._turns)} turn(s) in flight" if self._turns else ""))
                await trio.sleep(delay)
        return EXIT_OK  # stopped while still connecting

    async def aclose(self) -> None:
        if self._pool is not None:
            with trio.move_on_after(DISCONNECT_TIMEOUT) as scope:
                scope.shield = True
                await self._pool.aclose()
        if self._secrets is not None:  # tools were loaded: nothing they started may outlive us
            await self._tools.sweep()

    # --- session --------------------------------------------------------

    async def _serve(self, ws: WebSocketConnection) -> str:
        """One connection: "served" (it dropped after the hello: dial again), "dropped" (before),
        "refused" (4003: end), "error" (a protocol error: end) or "stop"."""
        outcome = "stop"
        with trio.CancelScope() as session:
            self._active = session
            if self.stopping:
                session.cancel()
            outcome = await self._handshake(ws)
            if outcome == "served":
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._send_loop, ws, nursery)
                    outcome = await self._receive_loop(ws)
                    nursery.cancel_scope.cancel()
        if self.stopping:
            with trio.move_on_after(DISCONNECT_TIMEOUT) as scope:
                scope.shield = True
                await ws.aclose(1001, "runner stopping")
            return "stop"
        return outcome

    async def _handshake(self, ws: WebSocketConnection) -> str:
        if self._prewarming and not self._prewarmed.is_set():
            # Dialed while importing: the hello waits for the import, so "online" still means
            # ready for a turn at once (a warm spare is warm), within the server's hello timeout.
            with trio.move_on_after(PREWARM_WAIT):
                await self._prewarmed.wait()
        in_flight = self._turns.claims()
        hello = Hello(self.config.runner_id, os.getpid(), PROTOCOL_VERSION, list(HARNESSES), in_flight,
                      features=list(self._turns.features))
        try:
            await ws.send_message(encode(hello))
            with trio.fail_after(HELLO_TIMEOUT):
                raw = await ws.get_message()
        except ConnectionClosed as exc:
            return self._closed(exc, "before acknowledging the hello")
        except trio.TooSlowError:
            log(f"no hello acknowledgement within {HELLO_TIMEOUT:.0f} s; dialing again")
            return "dropped"
        frame = await self._decode(ws, raw)
        if frame is None:
            return "error"
        if not isinstance(frame, HelloAck):
            await self._protocol_error(ws, f"expected hello.ack, got {frame.kind!r}")
            return "error"
        mark("runner.online")
        log(f"online as {self.config.runner_id} at {self.config.ws_url} (pid {os.getpid()})"
            + (f", {len(in_flight)} turn(s) in flight" if in_flight else ""))
        return "served"

    def _closed(self, exc: ConnectionClosed, when: str) -> str:
        """What a close by the server means: end (refused, a protocol error) or dial again."""
        served = not when
        when = f" {when}" if when else ""
        code = exc.reason.code if exc.reason is not None else None
        if code == REFUSED:
            log(f"server refused this runner{when}: {_close_reason(exc)}; exiting")
            self.exit_code = EXIT_ERROR
            return "refused"
        if code in FATAL:
            log(f"server closed the connection{when}: {_close_reason(exc)}; exiting")
            self.exit_code = EXIT_ERROR
            return "error"
        if not self.stopping:
            log(f"server closed the connection{when}: {_close_reason(exc)}; dialing again"
                + (f" ({len(self._turns)} turn(s) in flight)" if self._turns else ""))
        return "served" if served else "dropped"

    def _import_harness(self) -> None:
        # In a worker thread: the loop keeps watching stdin and signals meanwhile.
        self._import_tools()
        from omnigent.runner import harness

        pool = harness.ClientPool()
        try:
            harness.prewarm(pool, self.environ)
        except Exception as exc:  # only an optimisation; the turn will report a real problem
            log(f"prewarm failed: {one_line(exc)}")
        self._harness, self._pool = harness, pool

    def _import_tools(self) -> None:
        # Before the first tool can run: its orphans must come to us, not to init.
        if self._secrets is not None:
            return
        try:
            from omnigent.tools import reaper, secret_values
        except ImportError as exc:  # the turn reports it when a tool is asked for
            log(f"tools unavailable: {one_line(exc)}")
            return
        if not reaper.become_subreaper():
            log("could not become a child subreaper: a tool's daemonised processes are not swept here")
        self._secrets = secret_values(self.environ)

    async def prewarm(self) -> None:
        """Pay the import and the first client's cost while dialing, not inside the first turn."""
        self._prewarming = True
        try:
            with self._prewarm_scope:  # stopping abandons the thread: os._exit ends it with us
                await trio.to_thread.run_sync(self._import_harness, abandon_on_cancel=True)
        finally:
            self._prewarmed.set()
        mark("runner.prewarmed")

    async def _load_harness(self) -> ModuleType:
        if self._harness is None and self._prewarming:
            await self._prewarmed.wait()
        if self._harness is None:  # prewarm failed to import it: the turn says why
            await trio.to_thread.run_sync(self._import_harness)
        assert self._harness is not None
        return self._harness

    async def receive_identity(self, fd: int) -> int | None:
        """An early runner's identity from its pipe (tree.early); an exit code when there is none.

        Sets the environment its host gives a runner (id, secret, server URL,
        tool policy), moves stdout and stderr to its log, and loads the config.
        """
        data = b""
        with self._stoppable():
            try:
                stream = trio.lowlevel.FdStream(fd)
            except OSError as exc:
                log(f"cannot read the identity pipe: {exc}")
                return EXIT_USAGE
            async with stream:
                try:
                    while chunk := await stream.receive_some(65536):
                        data += chunk
                except (OSError, trio.BrokenResourceError):
                    pass
        if self.stopping:
            return self.exit_code
        if not data:
            return EXIT_OK  # not adopted: its launcher needed no runner after all
        try:
            identity = json.loads(data)
            for key, value in identity["env"].items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            _reopen_output(identity["log_path"])
        except (ValueError, KeyError, TypeError, AttributeError, OSError) as exc:
            log(f"bad identity on the identity pipe: {type(exc).__name__}")
            return EXIT_USAGE
        os.environ.pop(IDENTITY_FD_VAR, None)
        try:
            self.config = load_config(os.environ)
        except ConfigError as exc:
            log(f"omnigent runner: {exc}")
            return EXIT_USAGE
        mark("runner.identity")
        return None

    async def _receive_loop(self, ws: WebSocketConnection) -> str:
        while True:
            try:
                raw = await ws.get_message()
            except ConnectionClosed as exc:
                return self._closed(exc, "")
            frame = await self._decode(ws, raw)
            if frame is None:
                return "error"
            if isinstance(frame, Ping):
                # straight to the socket, not behind the turns' queued events: the
                # websocket's send lock lets it wait behind at most the frame being sent
                try:
                    await ws.send_message(encode(Pong(frame.ts)))
                except ConnectionClosed as exc:
                    return self._closed(exc, "")
            elif isinstance(frame, (TurnStart, ToolStart)):
                self._turns.start(frame)
            elif isinstance(frame, Cancel):
                self._turns.cancel(frame.turn_id)
            else:
                await self._protocol_error(ws, f"a server may not send {frame.kind!r} to a runner")
                return "error"

    async def _send_loop(self, ws: WebSocketConnection, nursery: trio.Nursery) -> None:
        # The turns' only writer: a cancelled turn can never cut a frame in half.
        # (Pongs go out from the receive loop; the websocket serialises whole messages.)
        while True:
            if self._unsent is None:
                self._unsent = await self._turns.queued.receive()
            frame, turn = self._unsent
            data = await _encode(frame)
            if len(data) > MAX_FRAME_BYTES:
                turn_id = getattr(frame, "turn_id", "?")
                log(f"turn {turn_id}: {frame.kind} frame of {len(data)} bytes exceeds the limit; dropped")
                data = encode(TurnFailed(turn_id, "frame_too_large",
                                         f"a {frame.kind} frame of {len(data)} bytes exceeds {MAX_FRAME_BYTES}"))
            try:
                await ws.send_message(data)
            except ConnectionClosed:
                nursery.cancel_scope.cancel()  # the receive loop says why; this frame goes first next time
                return
            self._unsent = None
            self._turns.sent(frame, turn)  # its end is out: nothing owed any more

    # --- turns (turns.py) ----------------------------------------------

    async def _execute(self, start: Start, emit: Emit, captured: list[str]) -> Frame:
        if isinstance(start, ToolStart):
            from . import tool_steps

            if self._secrets is None and self._prewarming:
                await self._prewarmed.wait()  # it imports the tools first
            if self._secrets is None:
                await trio.to_thread.run_sync(self._import_tools)
            return await tool_steps.run_tool_step(start, emit, captured, self._tools, self.environ)
        harness = await self._load_harness()
        return await harness.execute(self._pool, start, emit, self.environ)

    def _cancelled_tool(self, start: ToolStart, captured: list[str]) -> Frame:
        secrets = self._secrets or []
        if self._secrets is not None:  # as run_tool_step does: an early runner's environment grew since
            from omnigent.tools import secret_values

            secrets = secret_values(self.environ)
        return cancelled_result(start, captured, secrets)

    # --- protocol errors ------------------------------------------------

    async def _decode(self, ws: WebSocketConnection, raw: str | bytes) -> Frame | None:
        try:
            if len(raw) > THREAD_CODEC_BYTES:  # a long history: parsing it must not hold the loop
                return await trio.to_thread.run_sync(decode, raw)
            return decode(raw)
        except ProtocolError as exc:
            await self._protocol_error(ws, exc.reason, exc.close_code)
            return None

    async def _protocol_error(self, ws: WebSocketConnection, reason: str, code: int = ProtocolError.MALFORMED) -> None:
        # The server speaks the protocol; a bad frame is a bug, so stop loudly.
        log(f"protocol error, exiting: {reason}")
        self.exit_code = EXIT_ERROR
        with trio.move_on_after(DISCONNECT_TIMEOUT) as scope:
            scope.shield = True
            await ws.aclose(code, reason[:120])


async def _encode(frame: Frame) -> str | bytes:
    # A turn's output can be large: then it is encoded off the loop. A usual one
    # (an answer of a few KB) is cheaper to encode here than a thread's round trip.
    if isinstance(frame, TurnCompleted) and _larger_than(frame.output, THREAD_CODEC_BYTES):
        return await trio.to_thread.run_sync(encode, frame)
    return encode(frame)


def _larger_than(value: Any, budget: int) -> bool:
    """Whether the strings in `value` (nested lists and dicts) add up to more than `budget` characters."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            budget -= len(item)
        elif isinstance(item, dict):
            budget -= 8 * len(item)
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        if budget < 0:
            return True
    return False


def _dial_websocket(url: str, headers: list[tuple[bytes, bytes]]) -> Any:
    return open_websocket_url(url, extra_headers=headers, max_message_size=MAX_FRAME_BYTES,
                              connect_timeout=CONNECT_TIMEOUT, disconnect_timeout=DISCONNECT_TIMEOUT)


def _why(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    return one_line(f"{type(exc).__name__}: {cause}" if cause is not None else repr(exc), 200)


def _close_reason(exc: ConnectionClosed) -> str:
    reason = exc.reason
    if reason is None:
        return "closed"
    return f"code {reason.code}" + (f" ({reason.reason})" if reason.reason else "")


async def run(config: Config | None, environ: Mapping[str, str] = os.environ) -> int:
    """Serve until stopped; `config` None: an early runner, which reads it from its identity pipe."""
    runner = Runner(config or _PENDING, environ)
    async with trio.open_nursery() as nursery:
        await nursery.start(_watch_signals, runner)
        await nursery.start(_watch_stdin, runner)
        nursery.start_soon(runner.prewarm)  # in a thread: stdin EOF or SIGTERM stops us even mid-import
        code: int | None = None
        if config is None:
            code = await runner.receive_identity(int(environ[IDENTITY_FD_VAR]))
        if code is None:
            log(f"started pid {os.getpid()}, server {runner.config.server_url}")
            try:
                code = await runner.connect_and_serve()
            finally:
                await runner.aclose()
            log(f"exiting with code {code}")
        nursery.cancel_scope.cancel()
    assert code is not None
    return code


def main() -> int:
    config: Config | None = None
    if os.environ.get(IDENTITY_FD_VAR, "").isdigit():
        pass  # an early runner: its config comes on that pipe
    else:
        try:
            config = load_config(os.environ)
        except ConfigError as exc:
            print(f"omnigent runner: {exc}", file=sys.stderr)
            return EXIT_USAGE
    return trio.run(run, config)


def _reopen_output(log_path: str) -> None:
    """stdout and stderr to the log (append, 0600), as the host opens it for the runners it spawns."""
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
