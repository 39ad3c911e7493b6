"""Search, fork, rename and delete of sessions over the API and the SDK (server/sessions.py).

In-process servers over real sockets with a scripted fake runner that holds its turn
until told, so a delete meets a running turn; a second `Store` on the same file plays
another process (`omnigent sessions rm` while an `omnigent run` serves the session).
The SDK flow runs once under trio and once under asyncio, against `omnigent server
--runners 0` in a process of its own.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import anyio
import httpx
import pytest
import sniffio
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

import protocol as p
from omnigent.agents import bundle_bytes
from omnigent.client import InvalidInputError, NotFoundError, OmnigentClient
from omnigent.store import Store
from tests.integration.test_server_api import host_secret, start_server
from tests.support.processes import omnigent_server

AGENT_YAML = "name: catalog_agent\nprompt: be brief\nexecutor:\n  harness: openai-chat\n  model: m1\n"


@pytest.fixture
def bundle(tmp_path) -> bytes:
    path = tmp_path / "agent.yaml"
    path.write_text(AGENT_YAML)
    return bundle_bytes(path)


@pytest.fixture
async def server(nursery, tmp_path):
    store = Store(tmp_path / "chat.db")
    handle = await start_server(nursery, store, runner_wait=5.0, ping_interval=0.2)
    yield handle
    await handle.aclose()
    store.close()


@asynccontextmanager
async def held_runner(server, runner_id: str = "runner_held") -> AsyncIterator[dict]:
    """A runner that answers a turn only once `seen["release"]` is set; records Cancel frames."""
    seen: dict = {"started": trio.Event(), "release": trio.Event(), "cancelled": trio.Event(), "cancels": [],
                  "turns": []}
    ws_url = "ws" + server.url[4:] + f"/v1/runners/{runner_id}/ws"
    secret = host_secret(server, runner_id)
    async with open_websocket_url(ws_url, extra_headers=[("Authorization", f"Bearer {secret}")]) as ws:
        await ws.send_message(p.encode(p.Hello(runner_id=runner_id, pid=4321,
                                               protocol_version=p.PROTOCOL_VERSION, harnesses=["openai-chat"])))
        assert isinstance(p.decode(await ws.get_message()), p.HelloAck)

        async def answer(frame: p.TurnStart) -> None:
            await seen["release"].wait()
            item = {"type": "message", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "late answer"}]}
            await ws.send_message(p.encode(p.TurnCompleted(turn_id=frame.turn_id, response_id="resp_late",
                                                           output=[item])))
            seen["answered"] = frame.turn_id

        async def serve(n: trio.Nursery) -> None:
            try:
                while True:
                    frame = p.decode(await ws.get_message())
                    if isinstance(frame, p.Ping):
                        await ws.send_message(p.encode(p.Pong(ts=frame.ts)))
                    elif isinstance(frame, p.TurnStart):
                        seen["turns"].append(frame)
                        seen["started"].set()
                        n.start_soon(answer, frame)
                    elif isinstance(frame, p.Cancel):
                        seen["cancels"].append(frame.turn_id)
                        seen["cancelled"].set()
            except ConnectionClosed:
                pass

        async with trio.open_nursery() as n:
            n.start_soon(serve, n)
            yield seen
            n.cancel_scope.cancel()


async def _errors_are_json(http: httpx.AsyncClient, method: str, path: str, status: int, **kwargs) -> dict:
    resp = await http.request(method, path, **kwargs)
    assert resp.status_code == status, (method, path, resp.text)
    error = resp.json()["error"]
    assert error["code"] and error["message"]
    return error


async def test_search_fork_rename_and_delete(server, bundle):
    async with OmnigentClient(server.url) as client, httpx.AsyncClient(base_url=server.url) as http, \
            held_runner(server) as runner:
        runner["release"].set()  # answers at once
        src = (await client.create_session(bundle, title="Original"))["id"]
        result = await client.run_turn(src, "where is the lighthouse keeper?")
        assert result.text == "late answer"
        other = (await client.create_session(bundle))["id"]

        found = await client.sessions.list(search_query="lighthouse")
        assert [s.id for s in found] == [src] and found[0].snippet == "where is the lighthouse keeper?"
        assert (await client.sessions.list(search_query="late answer"))[0].id == src
        assert await client.sessions.list(search_query="lighthouse", agent_name="nobody") == []
        raw = (await http.get("/v1/sessions", params={"search_query": 'foo"bar AND * -x'})).json()
        assert raw["data"] == [] and raw["search_mode"] == "fts5" and raw["search_note"] is None
        with pytest.raises(InvalidInputError):
            await client.sessions.list(search_query="  ")

        items = await client.sessions.list_items(src)
        fork = await client.sessions.fork(src, title="Branch", up_to_response_id=items[0]["id"])
        assert fork.forked_from == src and fork.title == "Branch" and fork.status == "idle"
        assert [i["content"][0]["text"] for i in await client.sessions.list_items(fork.id)] == [
            "where is the lighthouse keeper?"]
        whole = await client.sessions.fork(src)
        assert whole.title == "Original (fork)" and len(await client.sessions.list_items(whole.id)) == 2
        assert (await client.sessions.get(src)).forked_from is None
        assert {s.id: s.forked_from for s in await client.sessions.list()}[fork.id] == src
        renamed = await client.sessions.rename(fork.id, "Renamed branch")
        assert renamed.title == "Renamed branch" and renamed.forked_from == src

        await _errors_are_json(http, "POST", f"/v1/sessions/{src}/fork", 404, json={"up_to_response_id": "msg_x"})
        await _errors_are_json(http, "POST", "/v1/sessions/conv_nope/fork", 404, json={})
        await _errors_are_json(http, "POST", f"/v1/sessions/{src}/fork", 400, json={"title": 3})
        await _errors_are_json(http, "POST", f"/v1/sessions/{src}/fork", 400, json={"bogus": 1})
        await _errors_are_json(http, "POST", f"/v1/sessions/{src}/fork", 400, json=[1])
        await _errors_are_json(http, "POST", f"/v1/sessions/{src}/fork", 415, content=b"{}")
        await _errors_are_json(http, "GET", "/v1/sessions", 400, params={"search_query": ""})
        await _errors_are_json(http, "DELETE", "/v1/sessions/conv_nope", 404)

        resp = await http.delete(f"/v1/sessions/{src}")
        assert resp.status_code == 200
        assert resp.json() == {"id": src, "object": "session.deleted", "deleted": True}
        with pytest.raises(NotFoundError):
            await client.sessions.get(src)
        with pytest.raises(NotFoundError):
            await client.sessions.delete(src)
        assert {s.id for s in await client.sessions.list()} == {other, fork.id, whole.id}
        assert [s.id for s in await client.sessions.list(search_query="lighthouse")] == [whole.id, fork.id]
        await client.sessions.delete(other)
        assert (await client.sessions.get(fork.id)).forked_from == src  # a fork outlives its source


async def test_delete_cancels_the_running_turn_and_ends_the_streams(server, bundle):
    store: Store = server.state.store
    async with OmnigentClient(server.url) as client, httpx.AsyncClient(base_url=server.url) as http, \
            held_runner(server) as runner:
        sid = (await client.create_session(bundle))["id"]
        ws_url = "ws" + server.url[4:] + f"/v1/sessions/{sid}/ws"
        async with open_websocket_url(ws_url, extra_headers=[("Origin", "omnigent://internal")]) as ws, \
                http.stream("GET", f"/v1/sessions/{sid}/stream") as sse:
            assert json.loads(await ws.get_message())["type"] == "session.heartbeat"
            lines = sse.aiter_lines()
            assert (await anext(lines)).startswith("event: session.heartbeat")
            posted = await client.post_message(sid, "a question that will never be answered")
            with trio.fail_after(10):
                await runner["started"].wait()
            assert (await client.get_session(sid))["status"] == "running"

            resp = await http.delete(f"/v1/sessions/{sid}")
            assert resp.status_code == 200, resp.text
            with trio.fail_after(5):  # both streams end: SSE with [DONE], the websocket closed normally
                async for line in lines:
                    if line == "data: [DONE]":
                        break
                else:
                    raise AssertionError("the SSE stream ended without [DONE]")
                with pytest.raises(ConnectionClosed) as closed:
                    while True:
                        await ws.get_message()
            assert closed.value.reason.code == 1000
        with trio.fail_after(5):
            await runner["cancelled"].wait()
        assert runner["cancels"] == [posted["turn_id"]]
        for table in ("conversations", "conversation_items", "turns", "turn_steps", "session_events",
                      "conversation_claims", "session_agents"):
            column = "id" if table == "conversations" else "conversation_id"
            assert store.conn.execute(f"SELECT COUNT(*) FROM {table} WHERE {column} = ?", [sid]).fetchone() == (0,)
        for path in (f"/v1/sessions/{sid}", f"/v1/sessions/{sid}/items", f"/v1/sessions/{sid}/stream"):
            await _errors_are_json(http, "GET", path, 404)
        # the runner's answer to the deleted turn comes late: nothing is written, nothing breaks
        runner["release"].set()
        # and the runner is free for another session
        other = (await client.create_session(bundle))["id"]
        with trio.fail_after(10):
            result = await client.run_turn(other, "next one")
        assert result.text == "late answer" and (await client.get_session(other))["runner_id"] == "runner_held"
        assert store.conn.execute("SELECT COUNT(*) FROM conversation_items WHERE conversation_id = ?",
                                  [sid]).fetchone() == (0,)


async def test_a_session_deleted_by_another_process_is_404_not_a_crash(server, bundle, tmp_path):
    async with OmnigentClient(server.url) as client, httpx.AsyncClient(base_url=server.url) as http, \
            held_runner(server) as runner:
        idle = (await client.create_session(bundle))["id"]
        busy = (await client.create_session(bundle))["id"]
        await client.post_message(busy, "deleted while running")
        with trio.fail_after(10):
            await runner["started"].wait()
        with Store(tmp_path / "chat.db") as other_process:  # `omnigent sessions rm`, locally
            other_process.delete_conversation(idle)
            other_process.delete_conversation(busy)
        runner["release"].set()  # the running turn's answer arrives for a session that is gone
        for sid in (idle, busy):
            for method, path, kwargs in (
                    ("GET", f"/v1/sessions/{sid}", {}),
                    ("GET", f"/v1/sessions/{sid}/items", {}),
                    ("GET", f"/v1/sessions/{sid}/turns", {}),
                    ("GET", f"/v1/sessions/{sid}/stream", {}),
                    ("PATCH", f"/v1/sessions/{sid}", {"json": {"title": "x"}}),
                    ("POST", f"/v1/sessions/{sid}/events", {"json": {"type": "message", "data": {
                        "role": "user", "content": "still there?"}}}),
                    ("POST", f"/v1/sessions/{sid}/fork", {"json": {}}),
                    ("DELETE", f"/v1/sessions/{sid}", {})):
                await _errors_are_json(http, method, path, 404, **kwargs)
        # the server goes on: the same runner answers another session (after the late answer,
        # which it sent first on the same socket)
        fresh = (await client.create_session(bundle))["id"]
        with trio.fail_after(10):
            result = await client.run_turn(fresh, "anyone?")
        assert result.text == "late answer"
        assert busy not in {s["id"] for s in await client.list_sessions()}
        with trio.fail_after(5):
            while busy in server.state.turns._workers:  # the deleted session's worker stops by itself
                await trio.sleep(0.01)


# --- the SDK, under trio and asyncio, against a server process -------------------------------


@pytest.fixture(scope="module")
def bare_server(mock_credentials_env, tmp_path_factory) -> Iterator[str]:
    env = {**mock_credentials_env, "HOME": str(tmp_path_factory.mktemp("catalog-home"))}
    with omnigent_server(env, "--runners", "0") as url:
        yield url


async def _sdk_flow(url: str, bundle: bytes, marker: str) -> str:
    """Search, fork, rename and delete through the SDK; returns the async library it ran on."""
    async with OmnigentClient(url) as client:
        session = await client.sessions.create(bundle, title=f"sdk {marker}")
        await client.sessions.send_message(session.id, f"find the {marker} in here")  # queued: no runner
        with anyio.fail_after(10):
            [hit] = await client.sessions.list(search_query=marker)
        assert hit.id == session.id and marker in (hit.snippet or "")
        fork = await client.sessions.fork(session.id)
        assert fork.forked_from == session.id and fork.title == f"sdk {marker} (fork)"
        assert [i["content"][0]["text"] for i in await client.sessions.list_items(fork.id)] == [
            f"find the {marker} in here"]
        assert (await client.sessions.rename(fork.id, "renamed")).title == "renamed"
        await client.sessions.delete(session.id)  # its turn still waits for a runner: cancelled
        with pytest.raises(NotFoundError):
            await client.sessions.get(session.id)
        assert [s.id for s in await client.sessions.list(search_query=marker)] == [fork.id]
        await client.sessions.delete(fork.id)
        with pytest.raises(NotFoundError):
            await client.sessions.fork(fork.id)
    return sniffio.current_async_library()


@pytest.mark.asyncio
async def test_the_sdk_under_asyncio(bare_server, bundle):
    assert await _sdk_flow(bare_server, bundle, "asyncneedle") == "asyncio"


async def test_the_sdk_under_trio(bare_server, bundle):
    assert await _sdk_flow(bare_server, bundle, "trioneedle") == "trio"
