"""The SDK's stream and errors against a scripted SSE server, under trio and under asyncio.

Each test body is one coroutine run by `anyio.run` on both backends, so the
same code proves the SDK never depends on which event loop runs it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable

import anyio
import pytest

from omnigent_client import (
    AuthenticationError,
    Resync,
    StreamReset,
    ConflictError,
    APIConnectionError,
    Event,
    InvalidInputError,
    NotFoundError,
    OmnigentClient,
    OmnigentError,
    ServerError,
    TextDelta,
)
from tests.support.fake_sse import Conn, FakeServer, Request

BACKENDS = ["trio", "asyncio"]


def run_on(backend: str, fn: Callable[[], Awaitable[None]]) -> None:
    anyio.run(fn, backend=backend)


def delta(seq: int) -> dict:
    return {"type": "response.output_text.delta", "turn_id": "turn_1", "delta": f"d{seq}",
            "sequence_number": seq, "session_id": "conv_1"}


LOG = {seq: delta(seq) for seq in range(1, 21)}
LOG[5] = {"type": "x.from.the.future", "sequence_number": 5, "anything": [1, 2]}   # unknown type
LOG[7] = {"type": "response.output_text.delta", "turn_id": "turn_1", "sequence_number": 7}  # no `delta`


def replay(first: int, last: int, *, with_id: bool = False, log: dict = LOG, newest: int | None = None):
    """Greet with the server's newest number (0 when live from the start), then send first..last."""
    async def step(req: Request, conn: Conn) -> None:
        await conn.head()
        hb = newest if newest is not None else (0 if first == 1 else last)
        await conn.event({"type": "session.heartbeat", "sequence_number": hb})
        for seq in range(first, last + 1):
            await conn.event(log[seq], with_id=with_id)
    return step


def then(*steps):
    async def step(req: Request, conn: Conn) -> None:
        for s in steps:
            await s(req, conn)
    return step


async def cut_mid_message(req: Request, conn: Conn) -> None:
    await conn.raw('event: response.output_text.delta\ndata: {"type": "response.outp')


async def done(req: Request, conn: Conn) -> None:
    await conn.raw("data: [DONE]\n\n")


async def hold(req: Request, conn: Conn) -> None:
    await anyio.sleep_forever()


async def server_error(req: Request, conn: Conn) -> None:
    await conn.error(503, "runner_unavailable", "try later")


@pytest.mark.parametrize("backend", BACKENDS)
def test_stream_reconnects_with_no_gap_and_no_duplicate(backend):
    """Cut mid-message, an overlapping replay, `[DONE]`, a 503 and a restart: 1..20 once each."""
    fake = FakeServer(0, [
        then(replay(1, 6), cut_mid_message),     # after=None: live from heartbeat 0
        then(replay(5, 12, with_id=True), done),  # replays 5, 6 again: dropped by the client
        server_error,                              # retried, not raised
        then(replay(13, 15)),                      # connection ends, then the server "restarts"
        then(replay(16, 20), hold),
    ], pause_after={3: 0.3})

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(fake.run)
            async with OmnigentClient(fake.url) as client:
                seen: list[Event] = []
                with anyio.fail_after(20):
                    async with client.sessions.stream("conv_1") as stream:
                        async for event in stream:
                            seen.append(event)
                            if event.sequence_number == 20:
                                break
            tg.cancel_scope.cancel()
        assert [e.sequence_number for e in seen] == list(range(1, 21))
        assert all(e.type != "session.heartbeat" for e in seen)  # consumed, not yielded
        unknown, malformed = seen[4], seen[6]
        assert type(unknown) is Event and unknown.type == "x.from.the.future" and unknown.data["anything"] == [1, 2]
        assert type(malformed) is Event  # a known type missing its fields: generic, not an error
        assert isinstance(seen[0], TextDelta) and seen[0].delta == "d1"
        afters = [r.query.get("after") for r in fake.requests]
        assert afters[:4] == [None, "6", "12", "12"] and afters[-1] == "15", afters
        assert fake.requests[1].headers["last-event-id"] == "6"

    run_on(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_stream_from_a_sequence_number_and_heartbeats_on_request(backend):
    fake = FakeServer(0, [then(replay(4, 5), hold)])

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(fake.run)
            async with OmnigentClient(fake.url) as client:
                stream = client.sessions.stream("conv_1", after=3, heartbeats=True)
                with anyio.fail_after(10):
                    got = [await stream.__anext__() for _ in range(3)]
                await stream.aclose()
            tg.cancel_scope.cancel()
        assert [e.type for e in got] == ["session.heartbeat", "response.output_text.delta", "x.from.the.future"]
        assert fake.requests[0].query["after"] == "3"

    run_on(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cursor_the_server_cannot_serve_gets_one_resync_then_the_events_after_it(backend):
    """After 1..6 the server's log is another one (newest 1): it sends a Resync at 1, then 2..4."""
    fresh = {seq: {**delta(seq), "delta": f"new{seq}"} for seq in range(1, 5)}

    async def resync(req: Request, conn: Conn) -> None:
        await conn.event({"type": "session.resync", "sequence_number": 1, "session_id": "conv_1",
                          "reason": "ahead", "after": 6, "session": {"id": "conv_1"},
                          "items": [{"type": "message", "role": "user", "content": "hi"}],
                          "turns": [{"id": "turn_1", "status": "completed", "attempt": 1}]}, with_id=True)

    async def tail(req: Request, conn: Conn) -> None:
        for seq in range(2, 5):
            await conn.event(fresh[seq])

    fake = FakeServer(0, [
        replay(1, 6),                                               # then the connection ends
        then(replay(1, 0, newest=1), resync, tail, hold),           # greets with 1 < 6
    ])

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(fake.run)
            async with OmnigentClient(fake.url) as client:
                seen: list[Event] = []
                with anyio.fail_after(20):
                    async for event in client.sessions.stream("conv_1"):
                        seen.append(event)
                        if getattr(event, "delta", None) == "new4":
                            break
            tg.cancel_scope.cancel()
        resyncs = [e for e in seen if isinstance(e, Resync)]
        assert len(resyncs) == 1 and resyncs[0].sequence_number == 1 and resyncs[0].reason == "ahead"
        assert resyncs[0].turns[0]["status"] == "completed" and len(resyncs[0].items) == 1
        assert not any(isinstance(e, StreamReset) for e in seen)
        assert [e.data.get("delta") for e in seen[seen.index(resyncs[0]) + 1:]] == ["new2", "new3", "new4"]
        assert [r.query.get("after") for r in fake.requests] == [None, "6"]

    run_on(backend, main)


def _error_step(status: int, code: str):
    async def step(req: Request, conn: Conn) -> None:
        await conn.error(status, code, f"{code} says the server")
    return step


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("status", "code", "cls"), [
    (400, "invalid_input", InvalidInputError), (401, "unauthorized", AuthenticationError),
    (404, "not_found", NotFoundError), (409, "conflict", ConflictError),
    (500, "internal_error", ServerError), (503, "runner_unavailable", ServerError),
])
def test_typed_errors(backend, status, code, cls):
    fake = FakeServer(0, [_error_step(status, code)])

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(fake.run)
            async with OmnigentClient(fake.url) as client:
                with pytest.raises(cls) as info:
                    await client.sessions.get("conv_1")
            tg.cancel_scope.cancel()
        assert isinstance(info.value, OmnigentError)
        assert (info.value.status_code, info.value.code) == (status, code)
        assert info.value.message == f"{code} says the server"

    run_on(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_missing_session_ends_the_stream_with_not_found(backend):
    fake = FakeServer(0, [_error_step(404, "not_found")])

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(fake.run)
            async with OmnigentClient(fake.url) as client:
                with anyio.fail_after(10), pytest.raises(NotFoundError):
                    async for _ in client.sessions.stream("conv_gone"):
                        pass
            tg.cancel_scope.cancel()

    run_on(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_connection_refused_is_a_connection_error(backend):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused

        async def main() -> None:
            async with OmnigentClient(f"http://127.0.0.1:{port}") as client:
                with pytest.raises(APIConnectionError, match="cannot reach"):
                    await client.sessions.list()
                with pytest.raises(APIConnectionError):
                    async for _ in client.sessions.stream("conv_1", reconnect=False):
                        pass

        run_on(backend, main)


def test_importing_the_sdk_loads_no_server_code_and_no_trio():
    code = ("import sys, omnigent_client\n"
            "heavy = ['quart', 'hypercorn', 'openai', 'sqlite_utils', 'trio', 'trio_websocket', 'quart_trio']\n"
            "print(sorted(m for m in heavy if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd="/")  # not the repo root: the installed package, as a user imports it
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
