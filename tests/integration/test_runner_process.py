"""Integration tests of the runner process (`python -m omnigent.runner`).

Why: the runner's contract is with processes it cannot see in a unit test:
the server it dials (a fake speaking the real protocol over a real
trio-websocket server at port 0), the model endpoint (the project's scripted
mock LLM on a real socket) and the supervisor that holds its stdin and sends
SIGTERM. Real processes, real clock, every wait bounded, every process reaped.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, WebSocketRequest, serve_websocket

from omnigent.testing import mock_llm
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
    TurnCompleted,
    TurnEvent,
    TurnFailed,
    TurnStart,
    decode,
    encode,
)

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "tok-secret"
WAIT = 10  # generous bound on anything that waits on a process or socket


class Conn:
    """The server side of one runner websocket."""

    def __init__(self, request: WebSocketRequest, ws: WebSocketConnection) -> None:
        self.path = request.path
        self.headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        self.ws = ws

    async def recv(self) -> Frame:
        with trio.fail_after(WAIT):
            return decode(await self.ws.get_message())

    async def send(self, frame: Frame) -> None:
        await self.ws.send_message(encode(frame))

    async def handshake(self, features: list[str] | None = None) -> Hello:
        """Acknowledge the hello as a server of before `HelloAck.features` does, or with `features`."""
        hello = await self.recv()
        assert isinstance(hello, Hello)
        await self.send(HelloAck(ping_interval=5.0, features=features or []))
        return hello

    async def turn(self, turn: TurnStart) -> list[Frame]:
        """Start a turn and collect its frames up to and including the terminal one."""
        await self.send(turn)
        frames = []
        while True:
            frame = await self.recv()
            assert getattr(frame, "turn_id", None) == turn.turn_id, frame
            frames.append(frame)
            if isinstance(frame, (TurnCompleted, TurnFailed)):
                return frames


class FakeServer:
    """A trio-websocket server standing in for omnigent's runner endpoint."""

    def __init__(self) -> None:
        self._send, self._conns = trio.open_memory_channel[Conn](10)
        self.port = 0
        self.reject_status: int | None = None

    async def _handler(self, request: WebSocketRequest) -> None:
        if self.reject_status is not None:
            await request.reject(self.reject_status, body=b"unauthorized")
            return
        ws = await request.accept()
        await self._send.send(Conn(request, ws))
        await trio.sleep_forever()  # the test drives the connection; teardown ends it

    async def serve(self, nursery: trio.Nursery, port: int = 0) -> None:
        server = await nursery.start(partial_serve, self._handler, port)
        self.port = server.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def accept(self) -> Conn:
        with trio.fail_after(WAIT):
            return await self._conns.receive()


async def partial_serve(handler: Any, port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    await serve_websocket(handler, "127.0.0.1", port, None, max_message_size=MAX_FRAME_BYTES,
                          task_status=task_status)


class Runner:
    def __init__(self, proc: trio.Process, runner_id: str, log: Path) -> None:
        self.proc = proc
        self.runner_id = runner_id
        self.log = log

    async def wait(self, timeout: float = WAIT) -> int:
        with trio.fail_after(timeout):
            return await self.proc.wait()

    async def close_stdin(self) -> None:
        await self.proc.stdin.aclose()


@pytest.fixture
async def server(nursery: trio.Nursery) -> FakeServer:
    fake = FakeServer()
    await fake.serve(nursery)
    return fake


@pytest.fixture
async def llm(nursery: trio.Nursery):
    url = await nursery.start(mock_llm.serve)
    async with httpx.AsyncClient(base_url=url, timeout=WAIT) as http:
        yield url, http


async def configure(http: httpx.AsyncClient, responses: list[dict[str, Any]], key: str = "default") -> None:
    resp = await http.post("/mock/configure", json={"key": key, "responses": responses})
    resp.raise_for_status()


@pytest.fixture
async def spawn(tmp_path: Path, llm):
    """Start runner processes; teardown SIGKILLs any survivor's group and reaps it."""
    procs: list[trio.Process] = []
    llm_url, _ = llm

    async def start(server_url: str, *, env: dict[str, str] | None = None, drop: tuple[str, ...] = ()) -> Runner:
        runner_id = f"runner_{uuid.uuid4().hex}"
        full_env = {
            **os.environ,
            "OMNIGENT_SERVER_URL": server_url,
            "OMNIGENT_RUNNER_ID": runner_id,
            "OMNIGENT_RUNNER_TOKEN": TOKEN,
            "OPENAI_BASE_URL": f"{llm_url}/v1",
            "OPENAI_API_KEY": "mock-key",
            "PYTHONPATH": str(ROOT),
            **(env or {}),
        }
        for name in drop:
            full_env.pop(name, None)
        log = tmp_path / f"{runner_id}.log"
        with open(log, "wb") as err:
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "omnigent.runner"], stdin=subprocess.PIPE, stdout=err, stderr=err,
                env=full_env, cwd=ROOT, start_new_session=True)
        procs.append(proc)
        return Runner(proc, runner_id, log)

    yield start
    for proc in procs:
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        with trio.move_on_after(WAIT):
            await proc.wait()
        if proc.stdin is not None:
            await proc.stdin.aclose()


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def make_turn(model: str = "mock-model", harness: str = "openai-agents", text: str = "hi",
              session: str = "conv_1") -> TurnStart:
    agent = {"name": "t", "instructions": "Say it.", "harness": harness, "model": model, "auth": None,
             "reasoning_effort": None}
    history = [user("earlier"), {"type": "message", "role": "assistant",
                                 "content": [{"type": "output_text", "text": "before"}]}, user(text)]
    return TurnStart(turn_id=f"turn_{uuid.uuid4().hex[:8]}", session_id=session, attempt=1, agent=agent,
                     input=history, model=model)


def text_of(item: dict[str, Any]) -> str:
    return "".join(part.get("text", "") for part in item.get("content", []))


async def online(spawn, server: FakeServer, **kwargs: Any) -> tuple[Runner, Conn]:
    runner = await spawn(server.url, **kwargs)
    conn = await server.accept()
    await conn.handshake()
    return runner, conn


# --- tests ------------------------------------------------------------------------


async def test_hello_then_a_streamed_turn(spawn, server, llm):
    _, http = llm
    await configure(http, [{"text": "HELLO there", "stream": True}])
    runner = await spawn(server.url)
    conn = await server.accept()
    assert conn.path == f"/v1/runners/{runner.runner_id}/ws"
    assert conn.headers["authorization"] == f"Bearer {TOKEN}"
    hello = await conn.handshake()
    assert hello == Hello(runner.runner_id, runner.proc.pid, PROTOCOL_VERSION, ["openai-agents", "openai-chat"],
                          features=["history_cache", "items_in_completed"])

    turn = make_turn(text="say hello")
    frames = await conn.turn(turn)
    *events, done = frames
    assert all(isinstance(f, TurnEvent) for f in events)
    deltas = [f.event["delta"] for f in events if f.event["type"] == "response.output_text.delta"]
    assert "".join(deltas).strip() == "HELLO there"
    [item_done] = [f.event for f in events if f.event["type"] == "response.output_item.done"]
    assert text_of(item_done["item"]) == "HELLO there"
    assert isinstance(done, TurnCompleted)
    assert [text_of(i) for i in done.output] == ["HELLO there"]
    assert done.response_id and done.usage["input_tokens"] == 10

    # Exactly one model call, with the model name and the whole history as given.
    [body] = (await http.get("/mock/requests")).json()["requests"]
    assert body["model"] == "mock-model"
    assert body["instructions"] == "Say it."
    assert [m["role"] for m in body["input"]] == ["user", "assistant", "user"]
    assert body["input"][-1]["content"][0]["text"] == "say hello"



async def test_a_server_that_folds_items_gets_the_last_item_in_the_turns_end_only(spawn, server, llm):
    """Acknowledged `items_in_completed`: the item's event is left out, the TurnCompleted says so
    (and the test above is the same runner facing a server that does not fold: the event comes)."""
    _, http = llm
    await configure(http, [{"text": "FOLDED", "stream": True}, {"text": "CHAT FOLDED"}])
    runner = await spawn(server.url)
    conn = await server.accept()
    await conn.handshake(features=[ITEMS_IN_COMPLETED])
    for harness in ("openai-agents", "openai-chat"):
        *events, done = await conn.turn(make_turn(harness=harness))
        assert [f.event["type"] for f in events if f.event["type"] != "response.output_text.delta"] == [], events
        assert isinstance(done, TurnCompleted) and done.unannounced == len(done.output) == 1, done
    assert [text_of(i) for i in done.output] == ["CHAT FOLDED"] and runner.proc.returncode is None


async def test_a_long_streamed_answer_reaches_the_server_in_a_few_merged_deltas(spawn, server, llm):
    """The mock streams 40 words at once, a delta each; the runner sends the first alone and
    merges the rest (runner/outgoing.py): far fewer frames, exactly the same text."""
    _, http = llm
    words = [f"w{n}" for n in range(40)]
    await configure(http, [{"text": " ".join(words), "stream": True}])
    _, conn = await online(spawn, server)
    *events, done = await conn.turn(make_turn(text="go on"))
    deltas = [f.event["delta"] for f in events if f.event["type"] == "response.output_text.delta"]
    assert "".join(deltas).split() == words
    assert len(deltas) <= 10, deltas  # 2 on an idle machine: the first word, then the other 39
    assert isinstance(done, TurnCompleted) and [text_of(i) for i in done.output] == [" ".join(words)]

async def test_chat_harness_through_the_mock(spawn, server, llm):
    _, http = llm
    await configure(http, [{"text": "CHAT OK"}])
    _, conn = await online(spawn, server)
    frames = await conn.turn(make_turn(harness="openai-chat"))
    done = frames[-1]
    assert isinstance(done, TurnCompleted), frames
    assert [text_of(i) for i in done.output] == ["CHAT OK"]
    assert frames[-2].event["type"] == "response.output_item.done"


async def test_ping_is_answered_even_while_a_turn_waits_and_cancel_fails_the_turn(spawn, server, llm):
    _, http = llm
    await configure(http, [{"block": True, "text": "never"}])
    _, conn = await online(spawn, server)
    await conn.send(Ping(ts=1.25))
    assert await conn.recv() == Pong(ts=1.25)

    turn = make_turn()
    await conn.send(turn)
    with trio.fail_after(WAIT):  # the model call is parked in the mock
        while not (await http.get("/gate/pending")).json()["count"]:
            await trio.sleep(0.02)
    await conn.send(Ping(ts=2.5))
    assert await conn.recv() == Pong(ts=2.5)

    await conn.send(Cancel(turn.turn_id))
    assert await conn.recv() == TurnFailed(turn.turn_id, "cancelled", "cancelled")
    await conn.send(Cancel(turn.turn_id))  # no longer running: ignored
    # and the runner goes on serving
    await conn.send(Ping(ts=3.0))
    assert await conn.recv() == Pong(ts=3.0)


async def test_turns_of_different_sessions_run_concurrently(spawn, server, llm):
    _, http = llm
    await configure(http, [{"block": True, "text": "SLOW"}], key="slow-model")
    await configure(http, [{"text": "FAST"}])
    _, conn = await online(spawn, server)
    slow = make_turn(model="slow-model", session="conv_a")
    await conn.send(slow)
    with trio.fail_after(WAIT):
        while not (await http.get("/gate/pending")).json()["count"]:
            await trio.sleep(0.02)
    fast = await conn.turn(make_turn(session="conv_b"))
    assert [text_of(i) for i in fast[-1].output] == ["FAST"]
    (await http.post("/gate/release", json={})).raise_for_status()
    frames = []
    while not isinstance(frames[-1:] and frames[-1], (TurnCompleted, TurnFailed)):
        frames.append(await conn.recv())
    assert frames[-1].turn_id == slow.turn_id
    assert [text_of(i) for i in frames[-1].output] == ["SLOW"]


async def test_model_error_fails_the_turn_and_the_runner_keeps_serving(spawn, server, llm):
    _, http = llm
    await configure(http, [{"error": "mock failure", "status_code": 400}, {"text": "SECOND"}])
    _, conn = await online(spawn, server)
    first = make_turn()
    assert await conn.turn(first) == [TurnFailed(first.turn_id, "model_error", "Error code: 400 - mock failure")]
    second = await conn.turn(make_turn())
    assert [text_of(i) for i in second[-1].output] == ["SECOND"]
    assert (await http.get("/stats")).json()["request_count"] == 2  # a 400 is not retried


async def test_transient_model_error_is_retried_once_visibly(spawn, server, llm):
    _, http = llm
    await configure(http, [{"error": "busy", "status_code": 503, "retry_after": 0.1}, {"text": "SECOND"}])
    _, conn = await online(spawn, server)
    frames = await conn.turn(make_turn())
    retry = [f.event for f in frames if isinstance(f, TurnEvent) and f.event["type"] == "session.model.retry"]
    assert [(r["error"], r["attempt"], r["attempts"], r["delay"]) for r in retry] == [
        ("model error 503 (server error)", 2, 3, 0.1)]
    assert [text_of(i) for i in frames[-1].output] == ["SECOND"]
    assert (await http.get("/stats")).json()["request_count"] == 2  # the openai client itself never retries


async def test_unreachable_model_and_missing_credentials_are_turn_failures(spawn, server):
    _, conn = await online(spawn, server, env={"OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
                                                "OMNIGENT_MODEL_ATTEMPTS": "1"})
    [failed] = await conn.turn(make_turn())
    assert failed.code == "model_error"
    assert failed.message.startswith("Connection error: could not reach http://127.0.0.1:9/v1/responses")

    _, conn2 = await online(spawn, server, drop=("OPENAI_API_KEY",))
    [failed] = await conn2.turn(make_turn())
    assert failed.code == "auth_missing" and "OPENAI_API_KEY" in failed.message


async def test_stdin_eof_exits_0_promptly(spawn, server):
    runner, _ = await online(spawn, server)
    await runner.close_stdin()
    assert await runner.wait(timeout=2) == 0
    assert "stopping: stdin closed" in runner.log.read_text()


async def test_stdin_eof_while_still_connecting_exits_0(spawn):
    runner = await spawn(f"http://127.0.0.1:{free_port()}")
    await trio.sleep(0.3)
    await runner.close_stdin()
    assert await runner.wait(timeout=2) == 0


async def test_server_closing_the_websocket_makes_the_runner_dial_again(spawn, server):
    # issue 8: a runner outlives its server's restart (tests/integration/test_runner_reconnect.py)
    runner, conn = await online(spawn, server)
    await conn.ws.aclose(1001, "server shutting down")
    again = await server.accept()
    hello = await again.handshake()
    assert hello.runner_id == runner.runner_id and hello.in_flight == []
    assert runner.proc.returncode is None


async def test_sigterm_closes_the_websocket_and_exits_0(spawn, server, llm):
    _, http = llm
    await configure(http, [{"block": True}])
    runner, conn = await online(spawn, server)
    await conn.send(make_turn())  # a turn in flight must not delay the exit
    with trio.fail_after(WAIT):
        while not (await http.get("/gate/pending")).json()["count"]:
            await trio.sleep(0.02)
    runner.proc.send_signal(signal.SIGTERM)
    with pytest.raises(ConnectionClosed) as closed:
        await conn.recv()  # nothing more for the interrupted turn: the server will retry it
    assert closed.value.reason.code == 1001
    assert await runner.wait(timeout=2) == 0


async def test_undecodable_frame_exits_1(spawn, server):
    runner, conn = await online(spawn, server)
    await conn.ws.send_message('{"kind": "turn.start", "turn_id": 5}')
    assert await runner.wait() == 1
    assert "protocol error" in runner.log.read_text()


async def test_rejected_websocket_exits_1_without_retrying(spawn, server):
    server.reject_status = 401
    runner = await spawn(server.url)
    assert await runner.wait() == 1
    assert "HTTP 401" in runner.log.read_text()


async def test_close_before_hello_ack_exits_1(spawn, server):
    runner = await spawn(server.url)
    conn = await server.accept()
    assert isinstance(await conn.recv(), Hello)
    await conn.ws.aclose(4002, "protocol version")
    assert await runner.wait() == 1
    assert "before acknowledging the hello: code 4002" in runner.log.read_text()


async def test_connection_refused_is_retried_until_the_server_is_up(spawn, nursery):
    port = free_port()
    runner = await spawn(f"http://127.0.0.1:{port}")
    await trio.sleep(0.5)
    assert runner.proc.returncode is None
    late = FakeServer()
    await late.serve(nursery, port)
    conn = await late.accept()
    hello = await conn.handshake()
    assert hello.runner_id == runner.runner_id


async def test_missing_environment_exits_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIGENT_")}
    env["PYTHONPATH"] = str(ROOT)
    with trio.fail_after(WAIT):
        result = await trio.run_process([sys.executable, "-m", "omnigent.runner"], env=env, cwd=ROOT,
                                        capture_stderr=True, check=False, stdin=subprocess.DEVNULL)
    assert result.returncode == 2
    err = result.stderr.decode()
    assert err.count("\n") == 1 and "OMNIGENT_SERVER_URL" in err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
