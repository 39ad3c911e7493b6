"""The HTTP/websocket API over real sockets, with a scripted fake runner.

Checks the shapes the clients rely on, the single 4xx error body for bad
input, persist-before-forward, exactly-once answers, event replay from a
sequence number, and that a misbehaving runner is cut off without hurting
anyone else.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

import protocol as p
from omnigent.agents import bundle_bytes
from omnigent.client import OmnigentClient
from omnigent.link.memory import memory_link
from omnigent.link.runner_secrets import hash_secret, mint_secret
from omnigent.server.serve import run_server
from omnigent.server.sockets import bind_socket
from omnigent.store import Store

AGENT_YAML = "name: api_agent\nprompt: be brief\nexecutor:\n  harness: openai-chat\n  model: m1\n"


async def start_server(nursery, store: Store, **kwargs):
    """A server with no client token (as `omnigent server` on loopback) and a host link in memory."""
    server_end, host_end = memory_link()
    handle = await nursery.start(lambda task_status: run_server(
        store, bind_socket(), token=None, host_links=[server_end], task_status=task_status, **kwargs))
    handle.host_end = host_end
    return handle


@pytest.fixture
async def server(nursery, tmp_path):
    store = Store(tmp_path / "chat.db")
    handle = await start_server(nursery, store, runner_wait=2.0, ping_interval=0.2)
    yield handle
    await handle.aclose()
    store.close()


def host_secret(server, runner_id: str) -> str:
    """What a host does before it launches a runner: mint its secret, tell the server the hash."""
    secret = mint_secret()
    server.host_end.post(p.RunnerCredential(runner_id=runner_id, secret_hash=hash_secret(secret)))
    return secret


@pytest.fixture
def bundle(tmp_path) -> bytes:
    path = tmp_path / "agent.yaml"
    path.write_text(AGENT_YAML)
    return bundle_bytes(path)


@asynccontextmanager
async def fake_runner(server, runner_id: str = "runner_fake", *, secret: str | None = None,
                      reply: str = "pong!") -> AsyncIterator[dict]:
    """Connects like a host-launched runner (or with `secret`); answers every turn with `reply`."""
    seen: dict = {"turns": [], "ws": None}
    secret = secret or host_secret(server, runner_id)
    ws_url = "ws" + server.url[4:] + f"/v1/runners/{runner_id}/ws"
    async with open_websocket_url(ws_url, extra_headers=[("Authorization", f"Bearer {secret}")]) as ws:
        seen["ws"] = ws
        await ws.send_message(p.encode(p.Hello(runner_id=runner_id, pid=1234,
                                               protocol_version=p.PROTOCOL_VERSION, harnesses=["openai-chat"])))
        assert isinstance(p.decode(await ws.get_message()), p.HelloAck)

        async def serve() -> None:
            try:
                while True:
                    frame = p.decode(await ws.get_message())
                    if isinstance(frame, p.Ping):
                        await ws.send_message(p.encode(p.Pong(ts=frame.ts)))
                    elif isinstance(frame, p.TurnStart):
                        seen["turns"].append(frame)
                        item = {"type": "message", "role": "assistant", "status": "completed",
                                "content": [{"type": "output_text", "text": reply}]}
                        await ws.send_message(p.encode(p.TurnEvent(turn_id=frame.turn_id, event={
                            "type": "response.output_text.delta", "delta": reply})))
                        for _ in range(2):  # a duplicate completion must be ignored
                            await ws.send_message(p.encode(p.TurnCompleted(
                                turn_id=frame.turn_id, response_id="resp_1", output=[item])))
            except ConnectionClosed:
                pass

        async with trio.open_nursery() as n:
            n.start_soon(serve)
            yield seen
            n.cancel_scope.cancel()


async def test_health_and_error_shapes(server, bundle):
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.get("/health")).json() == {"status": "ok"}
        cases = [
            ("GET", "/v1/sessions/conv_nope", {}, 404, "not_found"),
            ("GET", "/v1/nothing", {}, 404, "not_found"),
            ("DELETE", "/health", {}, 405, "method_not_allowed"),
            ("POST", "/v1/sessions", {"content": b"{not json", "headers": {"Content-Type": "application/json"}}, 400, "invalid_input"),
            ("POST", "/v1/sessions", {"json": {"agent_id": 5}}, 400, "invalid_input"),
            ("POST", "/v1/sessions", {"json": {"agent_id": "ag_missing"}}, 404, "not_found"),
            ("POST", "/v1/sessions", {"json": [1, 2]}, 400, "invalid_input"),
            ("POST", "/v1/sessions", {"files": {"bundle": ("a.tar.gz", b"garbage")}}, 400, "invalid_input"),
            ("POST", "/v1/sessions", {"data": {"metadata": "{"}, "files": {"bundle": ("a.tar.gz", bundle)}}, 400, "invalid_input"),
            ("POST", "/v1/sessions", {"data": {"metadata": json.dumps({"reasoning_effort": "huge"})}, "files": {"bundle": ("a.tar.gz", bundle)}}, 400, "invalid_input"),
            ("POST", "/v1/sessions", {"data": {"metadata": json.dumps({"bogus": 1})}, "files": {"bundle": ("a.tar.gz", bundle)}}, 400, "invalid_input"),
            ("GET", "/v1/sessions?limit=0", {}, 400, "invalid_input"),
            ("GET", "/v1/sessions?limit=x", {}, 400, "invalid_input"),
            ("GET", "/v1/sessions?sort_by=title", {}, 400, "invalid_input"),
            ("GET", "/v1/sessions", {"headers": {"Origin": "https://evil.example"}}, 403, "forbidden"),
        ]
        for method, path, kwargs, status, code in cases:
            resp = await http.request(method, path, **kwargs)
            assert resp.status_code == status, (method, path, resp.text)
            assert resp.json()["error"]["code"] == code, (method, path, resp.text)
            assert resp.json()["error"]["message"]


async def test_session_crud_and_bad_patches(server, bundle):
    async with OmnigentClient(server.url) as client, httpx.AsyncClient(base_url=server.url) as http:
        session = await client.create_session(bundle, reasoning_effort="high", workspace="/tmp")
        sid = session["id"]
        assert sid.startswith("conv_") and session["agent_name"] == "api_agent"
        assert session["reasoning_effort"] == "high" and session["status"] == "idle"
        assert session["llm_model"] == "m1" and session["harness"] == "openai-chat"
        for body in ({"runner_id": "runner_offline"}, {"runner_id": 3}, {"title": 7},
                     {"reasoning_effort": "loud"}, {"unknown": 1}):
            resp = await http.patch(f"/v1/sessions/{sid}", json=body)
            assert resp.status_code == 400, body
        for body in ({"type": "message", "data": {"role": "user", "content": []}},
                     {"type": "message", "data": "hi"}, {"type": "dance"},
                     {"type": "message", "data": {"role": "user", "content": [{"type": "image"}]}}):
            resp = await http.post(f"/v1/sessions/{sid}/events", json=body)
            assert resp.status_code == 400, body
        patched = await client.patch_session(sid, title="Renamed", reasoning_effort=None)
        assert patched["title"] == "Renamed" and patched["reasoning_effort"] is None
        # nothing stored by the rejected requests
        assert await client.list_items(sid) == []
        listed = await client.list_sessions(agent_name="api_agent")
        assert [s["id"] for s in listed] == [sid]
        assert await client.list_sessions(agent_name="other") == []


async def test_turn_round_trip_persists_once_and_streams(server, bundle):
    async with OmnigentClient(server.url) as client, fake_runner(server) as runner:
        sid = (await client.create_session(bundle))["id"]
        result = await client.run_turn(sid, "first question")
        assert (result.status, result.text) == ("completed", "pong!")
        second = await client.run_turn(sid, "second question")
        assert second.text == "pong!"
        items = await client.list_items(sid)
        assert [(i["role"], i["content"][0]["text"]) for i in items] == [
            ("user", "first question"), ("assistant", "pong!"),
            ("user", "second question"), ("assistant", "pong!"),
        ]  # the duplicate completions were ignored
        # the runner got the full history, and the model name exactly
        last = runner["turns"][-1]
        assert last.model == "m1" and last.agent["instructions"] == "be brief"
        assert [i["role"] for i in last.input] == ["user", "assistant", "user"]
        session = await client.get_session(sid)
        assert session["runner_id"] == "runner_fake" and session["runner_online"] is True
        assert session["title"] == "first question"
        turns = await client.list_turns(sid)
        assert [t["status"] for t in turns] == ["completed", "completed"]
        # replay from a sequence number: everything after it, in order
        async with client.events(sid, after=0) as stream:
            heartbeat = await anext(stream)
            assert heartbeat["type"] == "session.heartbeat"
            seen = []
            async for event in stream:
                seen.append(event["sequence_number"])
                if event["sequence_number"] == heartbeat["sequence_number"]:
                    break
        assert seen == list(range(1, heartbeat["sequence_number"] + 1))
        status = await client.runner_status("runner_fake")
        assert status == {"runner_id": "runner_fake", "online": True, "pid": 1234}
        assert [r["runner_id"] for r in await client.list_runners()] == ["runner_fake"]


async def test_sse_stream_serves_missed_events(server, bundle):
    async with OmnigentClient(server.url) as client, fake_runner(server):
        sid = (await client.create_session(bundle))["id"]
        await client.run_turn(sid, "hello")
        async with httpx.AsyncClient(base_url=server.url) as http:
            async with http.stream("GET", f"/v1/sessions/{sid}/stream", params={"after": 0}) as resp:
                assert resp.headers["content-type"].startswith("text/event-stream")
                types = []
                async for line in resp.aiter_lines():
                    if line.startswith("event: "):
                        types.append(line[7:])
                    if types and types[-1] == "response.completed":
                        break
        assert types[0] == "session.heartbeat"
        assert "session.input.consumed" in types and "response.output_text.delta" in types


async def test_message_waits_for_a_runner_then_fails_clearly(server, bundle):
    async with OmnigentClient(server.url) as client:
        sid = (await client.create_session(bundle))["id"]
        with trio.fail_after(5):
            result = await client.run_turn(sid, "anyone there?")
        assert result.status == "failed"
        assert result.error["code"] == "runner_unavailable"
        items = await client.list_items(sid)
        assert [i["content"][0]["text"] for i in items] == ["anyone there?"]  # the message stays stored
        assert (await client.get_session(sid))["status"] == "idle"


async def test_message_sent_before_runner_connects_runs_when_it_does(server, bundle):
    async with OmnigentClient(server.url) as client:
        sid = (await client.create_session(bundle))["id"]
        async with client.events(sid) as stream:
            await anext(stream)
            posted = await client.post_message(sid, "early")
            async with fake_runner(server, reply="late but fine"):
                from omnigent.client.client import follow_turn

                with trio.fail_after(5):
                    result = await follow_turn(stream, posted["turn_id"])
        assert result.text == "late but fine"


async def test_bad_runner_is_cut_off_and_others_keep_working(server, bundle):
    ws_base = "ws" + server.url[4:]
    # no secret: refused with 4003
    async with open_websocket_url(f"{ws_base}/v1/runners/runner_x/ws") as ws:
        with pytest.raises(ConnectionClosed) as info:
            await ws.get_message()
        assert info.value.reason.code == 4003
    async with fake_runner(server) as good:
        # a runner speaking another protocol version gets 4002
        async with open_websocket_url(f"{ws_base}/v1/runners/runner_old/ws", extra_headers=[
                ("Authorization", f"Bearer {host_secret(server, 'runner_old')}")]) as ws:
            await ws.send_message(json.dumps({"kind": "hello", "runner_id": "runner_old", "pid": 1,
                                              "protocol_version": 99, "harnesses": []}))
            with pytest.raises(ConnectionClosed) as info:
                await ws.get_message()
            assert info.value.reason.code == 4002
        # garbage after a good hello gets 4000 and the runner goes offline
        async with open_websocket_url(f"{ws_base}/v1/runners/runner_bad/ws", extra_headers=[
                ("Authorization", f"Bearer {host_secret(server, 'runner_bad')}")]) as ws:
            await ws.send_message(p.encode(p.Hello(runner_id="runner_bad", pid=2,
                                                   protocol_version=p.PROTOCOL_VERSION, harnesses=[])))
            await ws.get_message()
            await ws.send_message("{]")
            with pytest.raises(ConnectionClosed) as info:
                while True:
                    await ws.get_message()
            assert info.value.reason.code == 4000
        async with OmnigentClient(server.url) as client:
            assert (await client.runner_status("runner_bad"))["online"] is False
            sid = (await client.create_session(bundle))["id"]
            await client.bind_runner(sid, "runner_fake")
            assert (await client.run_turn(sid, "still there?")).text == "pong!"
        assert good["turns"]


async def test_shutdown_closes_websockets_with_1001(nursery, tmp_path, bundle):
    store = Store(tmp_path / "chat.db")
    handle = await start_server(nursery, store)
    async with OmnigentClient(handle.url) as client:
        sid = (await client.create_session(bundle))["id"]
        async with fake_runner(handle) as runner:
            ws = runner["ws"]
            with trio.fail_after(2):  # not hypercorn's graceful timeout
                await handle.aclose()
                with pytest.raises(ConnectionClosed):
                    while True:
                        await ws.get_message()
            assert ws.closed.code == 1001
    store.close()
    assert sid
