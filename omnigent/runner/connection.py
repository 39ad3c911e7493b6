"""A runner's connection to its server: the dial, the hello, the frame loops, and dialing again.

Connecting is patient while the server starts (`CONNECT_PATIENCE`, until the
first hello is acknowledged). A dropped websocket does not end a runner: its
turns go on (the model's stream with them), their frames wait in the outbox,
and it dials the same URL again with the same id and secret (`redial.py`:
capped backoff with jitter), reporting the turns it still owes an end for
in its hello (`in_flight`), so a restarted server can adopt them. Only a
refusal ends it: 4003 (its secret is no longer accepted; the host replaces
it) or a protocol error.

The hello waits for the prewarm (at most `PREWARM_WAIT`, inside the server's
hello timeout), so "online" means ready for a turn at once (stack-notes §5,
G14) and a warm spare is warm.

Staying responsive: pongs are sent from the receive loop straight to the
socket, not queued behind turn events; the send loop is the turns' only
writer, so a cancelled turn never cuts a frame in half; and large frames are
decoded and encoded in a worker thread (`frames.py`), so a runner busy with
turns on a loaded machine still answers pings and is not killed as hung.
"""

from __future__ import annotations

import os
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
    ITEMS_IN_COMPLETED,
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
    TurnStart,
    encode,
)

from ..config.timeline import mark
from ._log import log, one_line
from .frames import decode_frame, encode_outgoing
from .redial import FATAL, REFUSED
from .state import EXIT_ERROR, EXIT_OK, RunnerState
from .ws_writes import send_messages

# Must match harness.HARNESSES (a unit test checks), without importing openai.
HARNESSES = ["openai-agents", "openai-chat"]

CONNECT_TIMEOUT = 5.0      # one attempt (G2: the 60 s default is far too long)
DISCONNECT_TIMEOUT = 2.0
CONNECT_PATIENCE = 30.0    # the server may still be starting
HELLO_TIMEOUT = 10.0
PREWARM_WAIT = 8.0         # a dialed connection waits this long for the import (the server: 10 s for a hello)


class ConnectionMixin(RunnerState):
    """Dialing, one connection's hello and frame loops, and what ends them."""

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
        # frames of the last link still unsent go first, each item's event back where a server
        # that does not fold them needs it (outgoing.py)
        self._outgoing.acknowledged(ITEMS_IN_COMPLETED in frame.features, self._unsent)
        self._unsent = None
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
                mark(f"turn.received:{frame.turn_id}")
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
            if not self._unsent:
                first = await self._outgoing.next()  # text deltas merged (outgoing.py)
                self._unsent = [first, *await self._outgoing.more_now()]  # what is ready with it
            batch = self._unsent
            data = [await encode_outgoing(frame) for frame, _ in batch]
            try:
                await send_messages(ws, data)  # in one write
            except ConnectionClosed:
                nursery.cancel_scope.cancel()  # the receive loop says why; these frames go first next time
                return
            self._unsent = None
            for frame, turn in batch:
                self._turns.sent(frame, turn)  # a step's end is out: nothing owed any more

    # --- protocol errors ------------------------------------------------

    async def _decode(self, ws: WebSocketConnection, raw: str | bytes) -> Frame | None:
        try:
            return await decode_frame(raw)
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


def dial_websocket(url: str, headers: list[tuple[bytes, bytes]]) -> Any:
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
