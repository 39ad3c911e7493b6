"""A real `omnigent server` restarted under a watching SDK stream: nothing missed, nothing twice.

The watcher's stream reconnects by itself from its last sequence number;
afterwards its events are compared with a fresh replay of the stored log.
"""

from __future__ import annotations

import socket

import anyio
import pytest

from omnigent_client import OmnigentClient, Resync, SessionsChat, StreamReset
from tests.conftest import configure_mock_llm
from tests.integration.test_sdk_server import MODEL, _online_runner, _start_server, bundle  # noqa: F401
from tests.support.processes import stop


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_a_stream_resumed_across_a_server_restart_misses_nothing_and_doubles_nothing(
        backend, mock_credentials_env, mock_llm_server_url, bundle, tmp_path):  # noqa: F811
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**mock_credentials_env, "HOME": str(tmp_path / "home")}
    url = f"http://127.0.0.1:{port}"
    configure_mock_llm(mock_llm_server_url, [{"text": "before the restart", "stream": True},
                                             {"text": "after the restart", "stream": True}], key=MODEL)

    async def main() -> None:
        proc = _start_server(env, port)
        try:
            async with OmnigentClient(url) as client:
                session = await client.sessions.create(bundle)
                await client.sessions.bind_runner(session.id, runner_id=await _online_runner(client))
                chat = SessionsChat(namespace=client.sessions, session=session)
                seen = []
                stream = client.sessions.stream(session.id, after=0)
                turns_done = anyio.Event()

                async def watch() -> None:
                    completed = 0
                    async with stream:
                        async for event in stream:
                            seen.append(event)
                            if event.type == "response.completed":
                                completed += 1
                                if completed == 2:
                                    turns_done.set()
                                    return

                async with anyio.create_task_group() as tg:
                    tg.start_soon(watch)
                    with anyio.fail_after(60):
                        assert (await chat.query("one")).text == "before the restart"
                    stop(proc)  # the watcher is mid-stream: its connection drops
                    proc = _start_server(env, port)
                    with anyio.fail_after(60):
                        await _online_runner(client)
                        assert (await chat.query("two")).text == "after the restart"
                        await turns_done.wait()
                assert stream.reconnects >= 1
                assert not any(isinstance(e, (Resync, StreamReset)) for e in seen)
                numbers = [e.sequence_number for e in seen]
                assert numbers == list(range(1, len(numbers) + 1))  # no gap, no duplicate
                replay = []
                with anyio.fail_after(30):
                    async with client.sessions.stream(session.id, after=0) as again:
                        async for event in again:
                            replay.append(event)
                            if event.sequence_number == numbers[-1]:
                                break
                assert [(e.sequence_number, e.type) for e in replay] == [(e.sequence_number, e.type) for e in seen]
                text = "".join(e.data["delta"] for e in seen if e.type == "response.output_text.delta")
                assert text == "before the restartafter the restart"
        finally:
            stop(proc)

    anyio.run(main, backend=backend)
