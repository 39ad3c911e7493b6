"""The SDK against a real `omnigent server --runners 1` with the mock LLM, under trio and asyncio.

The same flow runs twice: once as a trio test (pytest-trio's trio_mode) and
once as an `@pytest.mark.asyncio` test (pytest-asyncio), as seed test 4 does.
A TCP proxy that cuts connections mid-turn shows the stream resumes from its
last sequence number with nothing missed and nothing doubled.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
import sniffio

from omnigent.agents import bundle_bytes
from omnigent_client import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    OmnigentClient,
    SessionsChat,
    TextDelta,
)
from tests.support.processes import omnigent_server, stop
from tests.conftest import configure_mock_llm
from tests.support.tcp_proxy import Proxy

MODEL = "sdk-model"


@pytest.fixture(scope="module")
def sdk_server(mock_credentials_env, tmp_path_factory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("sdk-home")
    env = {**mock_credentials_env, "HOME": str(home)}
    with omnigent_server(env, "--runners", "1") as url:
        yield url


@pytest.fixture
def bundle(tmp_path) -> bytes:
    path = tmp_path / "sdk_agent.yaml"
    path.write_text(f"name: sdk_agent\nprompt: Reply with the marker.\nexecutor:\n  model: {MODEL}\n")
    return bundle_bytes(path)


class _RecordingAuth(httpx.Auth):
    """Notes which async library runs each request the SDK sends."""

    def __init__(self) -> None:
        self.libraries: set[str] = set()

    async def async_auth_flow(self, request):
        self.libraries.add(sniffio.current_async_library())
        yield request


async def _online_runner(client: OmnigentClient) -> str:
    with anyio.fail_after(30):
        while not (runners := await client.runners.list()):
            await anyio.sleep(0.1)  # no event says "a runner came online"
    return runners[0]["runner_id"]


async def _flow(url: str, mock_url: str, bundle: bytes, tmp_path: Path) -> set[str]:
    """Seed test 4's steps, plus files and typed errors; returns the async libraries seen."""
    auth = _RecordingAuth()
    configure_mock_llm(mock_url, [{"text": "SDK_MARKER_OK"}], key=MODEL)
    async with OmnigentClient(base_url=url, auth=auth) as client:
        created = await client.sessions.create(bundle, reasoning_effort="high", title="sdk")
        assert (created.reasoning_effort, created.title, created.agent_name) == ("high", "sdk", "sdk_agent")
        bound = await client.sessions.bind_runner(created.id, runner_id=await _online_runner(client))
        assert bound.runner_id and bound.runner_online
        session_files = client.files.for_session(bound.id)
        chat = SessionsChat(namespace=client.sessions, files_uploader=session_files.upload,
                            files_getter=session_files.get, session=bound)
        with anyio.fail_after(60):
            result = await chat.query("respond with the configured marker")
        assert "SDK_MARKER_OK" in result.text and result.status == "completed"
        assert (await client.sessions.get(created.id)).reasoning_effort == "high"
        items = await client.sessions.list_items(created.id)
        assert [i["role"] for i in items] == ["user", "assistant"]
        assert created.id in [s.id for s in await client.sessions.list(agent_name="sdk_agent")]

        # files: stored and listed, but a message may not reference one (it would not reach the model)
        note = tmp_path / "notes.txt"
        note.write_text("hello file")
        uploaded = await session_files.upload(note)
        assert (uploaded.filename, uploaded.bytes, uploaded.content_type) == ("notes.txt", 10, "text/plain")
        assert await session_files.get(uploaded.id) == uploaded
        assert [f.id for f in await session_files.list()] == [uploaded.id]
        assert await session_files.get_content(uploaded.id) == b"hello file"
        with pytest.raises(InvalidInputError, match="not supported by harness"):
            await chat.query("read the file", files=[str(note)])
        with pytest.raises(NotFoundError):
            await session_files.get("file_nope")

        # typed errors from the real server
        with pytest.raises(NotFoundError) as missing:
            await client.sessions.get("conv_does_not_exist")
        assert missing.value.status_code == 404 and missing.value.code == "not_found"
        with pytest.raises(InvalidInputError):
            await client.sessions.create(bundle, reasoning_effort="enormous")
        with pytest.raises(InvalidInputError, match="not registered"):
            await client.sessions.bind_runner(created.id, runner_id="runner_nobody")
        with pytest.raises(NotFoundError):  # answered before its body is read: the connection
            await client.sessions.send_message("conv_nope", "hi")  # must still serve the next call
        with anyio.fail_after(5):
            await client.sessions.get(created.id)
        with pytest.raises(ConflictError):
            await client.sessions.post_event(created.id, {"type": "retry"})
        assert (await client.sessions.unbind_runner(created.id)).runner_id is None
    return auth.libraries


@pytest.mark.asyncio
async def test_sdk_under_asyncio(sdk_server, mock_llm_server_url, bundle, tmp_path):
    assert sniffio.current_async_library() == "asyncio"
    assert await _flow(sdk_server, mock_llm_server_url, bundle, tmp_path) == {"asyncio"}


async def test_sdk_under_trio(sdk_server, mock_llm_server_url, bundle, tmp_path):
    assert await _flow(sdk_server, mock_llm_server_url, bundle, tmp_path) == {"trio"}


async def test_stream_resumes_across_dropped_connections_mid_turn(sdk_server, mock_llm_server_url, bundle):
    words = [f"w{i}" for i in range(60)]
    configure_mock_llm(mock_llm_server_url, [{"text": " ".join(words), "stream": True},
                                             {"text": "and after", "stream": True}], key=MODEL)
    upstream = int(sdk_server.rsplit(":", 1)[1])
    async with anyio.create_task_group() as tg:
        proxy = await tg.start(Proxy(upstream).run)
        async with OmnigentClient(sdk_server) as direct, OmnigentClient(proxy.url) as watched:
            session = await direct.sessions.create(bundle)
            await direct.sessions.bind_runner(session.id, runner_id=await _online_runner(direct))
            start = session.last_sequence_number
            stream = watched.sessions.stream(session.id, after=start)
            await direct.sessions.send_message(session.id, "go")  # before subscribing: replayed
            seqs, deltas, drops, completed, first = [], [], 0, 0, True
            async with stream:
                with anyio.fail_after(60):
                    async for event in stream:
                        seqs.append(event.sequence_number)
                        if isinstance(event, TextDelta):
                            deltas.append(event.delta)
                            if first:  # cut the connection mid-answer: after each turn's first delta
                                first = False  # (the runner sends the first word alone, the rest merged)
                                proxy.drop_all()
                                drops += 1
                        if event.type == "response.completed":
                            completed += 1
                            first = True
                            deltas.append(" ")  # the turns' texts apart
                            if completed == 2:
                                break
                            # the cuts may all land after the answer was read in one chunk: a
                            # second turn makes the stream read again, over a new connection
                            await direct.sessions.send_message(session.id, "and then")
                    else:
                        raise AssertionError("stream ended")
            tg.cancel_scope.cancel()
    assert drops >= 1 and stream.reconnects >= 1 and proxy.connections >= 2
    assert seqs == list(range(start + 1, start + 1 + len(seqs)))  # no gap, no duplicate
    assert "".join(deltas).split() == words + ["and", "after"]


def _start_server(env: dict, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "omnigent", "server", "--runners", "1", "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    assert "listening on " in line, line
    return proc


@pytest.mark.slow
async def test_stream_survives_a_server_restart(mock_credentials_env, mock_llm_server_url, bundle, tmp_path):
    """A watcher's stream outlives the server: it reconnects and sees the next turn, nothing twice.

    The log is stored, so the numbers simply go on (no `StreamReset`): no
    duplicate, and the turn after the restart is seen.
    """
    import socket

    from omnigent_client import StreamReset

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**mock_credentials_env, "HOME": str(tmp_path / "home")}
    url = f"http://127.0.0.1:{port}"
    configure_mock_llm(mock_llm_server_url, [{"text": "BEFORE_RESTART"}, {"text": "AFTER_RESTART"}], key=MODEL)
    proc = _start_server(env, port)
    try:
        async with OmnigentClient(url) as client:
            session = await client.sessions.create(bundle)
            await client.sessions.bind_runner(session.id, runner_id=await _online_runner(client))
            chat = SessionsChat(namespace=client.sessions, session=session)
            with anyio.fail_after(60):
                assert (await chat.query("one")).text == "BEFORE_RESTART"
            after = (await client.sessions.get(session.id)).last_sequence_number
            seen = []
            stream = client.sessions.stream(session.id, after=after, heartbeats=True)
            subscribed = anyio.Event()
            async with anyio.create_task_group() as tg:
                async def watch() -> None:
                    async with stream:
                        async for event in stream:
                            if event.type == "session.heartbeat":
                                subscribed.set()
                                continue
                            seen.append(event)
                            if event.type == "response.completed":
                                return
                tg.start_soon(watch)
                with anyio.fail_after(30):
                    await subscribed.wait()  # connected, so the restart drops a live connection
                stop(proc)
                proc = _start_server(env, port)
                with anyio.fail_after(60):
                    await _online_runner(client)
                    await client.sessions.send_message(session.id, "two")
            assert stream.reconnects >= 1
            seqs = [e.sequence_number for e in seen]
            resets = [e for e in seen if isinstance(e, StreamReset)]
            if resets:  # the log restarted: numbers go on from the new server's
                assert len(resets) == 1 and resets[0].previous == after
                tail = seqs[seqs.index(resets[0].sequence_number) + 1:]
                assert tail == sorted(set(tail))
            else:
                assert seqs == list(range(after + 1, after + 1 + len(seqs)))
            completed = seen[-1]
            assert "AFTER_RESTART" in str(completed.data["response"])
    finally:
        stop(proc)


def test_file_routes_refuse_bad_uploads_with_4xx_json(sdk_server, bundle):
    with httpx.Client(base_url=sdk_server, headers={"Origin": "omnigent://internal"}, timeout=10) as http:
        sid = http.post("/v1/sessions", data={"metadata": "{}"},
                        files={"bundle": ("agent.tar.gz", bundle, "application/gzip")}).json()["session_id"]
        other = http.post("/v1/sessions", data={"metadata": "{}"},
                          files={"bundle": ("agent.tar.gz", bundle, "application/gzip")}).json()["session_id"]
        base = f"/v1/sessions/{sid}/files"

        def code(resp: httpx.Response) -> tuple[int, str]:
            return resp.status_code, resp.json()["error"]["code"]

        assert code(http.post(base, json={"file": "x"})) == (400, "invalid_input")
        assert code(http.post(base, files={"other": ("a.txt", b"x")})) == (400, "invalid_input")
        assert code(http.post(base, files={"file": ("", b"x")})) == (400, "invalid_input")
        assert code(http.post(base, files={"file": ("big.bin", b"\0" * (10 * 1024 * 1024 + 1))})) == (413, "too_large")
        assert code(http.post("/v1/sessions/conv_nope/files", files={"file": ("a.txt", b"x")})) == (404, "not_found")
        assert code(http.get("/v1/sessions/conv_nope/files")) == (404, "not_found")
        created = http.post(base, files={"file": ("../../etc/a.txt", b"exactly 10 MiB is fine" )})
        assert created.status_code == 201 and created.json()["filename"] == "a.txt"
        file_id = created.json()["id"]
        assert code(http.get(f"/v1/sessions/{other}/files/{file_id}")) == (404, "not_found")  # not its file
        assert http.get(f"/v1/sessions/{sid}/resources/files/{file_id}").json()["metadata"]["bytes"] == 22
        message = {"type": "message", "data": {"role": "user", "content": [
            {"type": "input_text", "text": "see"}, {"type": "input_file", "file_id": file_id}]}}
        refused = http.post(f"/v1/sessions/{sid}/events", json=message)
        assert code(refused) == (400, "invalid_input")
        assert "not supported by harness" in refused.json()["error"]["message"]
        assert http.get(f"/v1/sessions/{sid}/items").json()["data"] == []  # nothing was stored


async def test_chat_send_yields_the_turn_as_typed_events(sdk_server, mock_llm_server_url, bundle):
    from omnigent_client import InputConsumed, ResponseCompleted, ResponseCreated

    configure_mock_llm(mock_llm_server_url, [{"text": "one two three", "stream": True}], key=MODEL)
    async with OmnigentClient(sdk_server) as client:
        session = await client.sessions.create(bundle)
        await client.sessions.bind_runner(session.id, runner_id=await _online_runner(client))
        chat = SessionsChat(namespace=client.sessions, session=session)
        with anyio.fail_after(60):
            events = [event async for event in chat.send("count")]
    kinds = [type(e) for e in events]
    assert kinds[0] is InputConsumed and ResponseCreated in kinds and kinds[-1] is ResponseCompleted
    assert "".join(e.delta for e in events if isinstance(e, TextDelta)).split() == ["one", "two", "three"]
    assert len({e.turn_id for e in events}) == 1
    seqs = [e.sequence_number for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
