"""Trust boundaries over real sockets: browsers, Host names, client tokens, explicit runners.

A web page (another local port, `null`, any other origin) cannot drive the
server over HTTP or any websocket; Host names are checked against what the
server serves; the client token opens client routes and never a runner
route; explicit runners registered by a client serve only sessions bound to them.
"""

from __future__ import annotations

import json

import httpx
import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

import protocol as p
from omnigent.agents import bundle_bytes
from omnigent.client import OmnigentClient
from omnigent.server.guard import Guard
from omnigent.store import Store
from tests.integration.test_server_api import AGENT_YAML, fake_runner, host_secret, start_server

TOKEN = "client-token-for-tests"


@pytest.fixture
def bundle(tmp_path) -> bytes:
    path = tmp_path / "agent.yaml"
    path.write_text(AGENT_YAML)
    return bundle_bytes(path)


@pytest.fixture
async def store(tmp_path):
    store = Store(tmp_path / "chat.db")
    yield store
    store.close()


@pytest.fixture
async def server(nursery, store):
    handle = await start_server(nursery, store, runner_wait=1.0, ping_interval=0.2)
    yield handle
    await handle.aclose()


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


BAD_ORIGINS = ["http://localhost:3000", "null", "https://evil.example", "http://127.0.0.1",
               "https://127.0.0.1:{port}", "http://evil.example:{port}", "http://127.0.0.1:{port}.evil.example",
               "file://", "omnigent://internal.evil"]


async def test_cross_origin_requests_are_refused_before_they_act(server, store, bundle):
    port = port_of(server.url)
    async with OmnigentClient(server.url) as client, httpx.AsyncClient(base_url=server.url) as http:
        sid = (await client.create_session(bundle))["id"]
        for origin in BAD_ORIGINS:
            origin = origin.format(port=port)
            headers = {"Origin": origin}
            resp = await http.get("/v1/sessions", headers=headers)
            assert resp.status_code == 403 and resp.json()["error"]["code"] == "forbidden", origin
            # a CORS "simple request": text/plain POST of a message
            resp = await http.post(f"/v1/sessions/{sid}/events", headers={**headers, "Content-Type": "text/plain"},
                                   content=json.dumps({"type": "message", "data": {"role": "user", "content": "x"}}))
            assert resp.status_code == 403, origin
            # multipart is CORS-simple too
            resp = await http.post("/v1/sessions", headers=headers, files={"bundle": ("a.tar.gz", bundle)})
            assert resp.status_code == 403 and resp.json()["error"]["code"] == "forbidden", origin
        assert [s["id"] for s in await client.list_sessions()] == [sid]  # nothing created
        assert await client.list_items(sid) == []                       # nothing posted
        for origin in (None, "omnigent://internal", f"http://127.0.0.1:{port}", f"http://localhost:{port}",
                       f"http://[::1]:{port}"):
            resp = await http.get("/v1/sessions", headers={"Origin": origin} if origin else {})
            assert resp.status_code == 200, origin


async def test_cross_origin_websocket_upgrades_are_refused(server, store, bundle):
    ws_base = "ws" + server.url[4:]
    async with OmnigentClient(server.url) as client:
        sid = (await client.create_session(bundle))["id"]
    for path in (f"/v1/sessions/{sid}/ws", "/v1/runners/runner_w/ws"):
        extra = [("Authorization", f"Bearer {host_secret(server, 'runner_w')}")] if "runners" in path else []
        for origin in ("http://localhost:3000", "null"):
            with pytest.raises(ConnectionRejected) as info:
                async with open_websocket_url(ws_base + path, extra_headers=[("Origin", origin), *extra]):
                    pass
            assert info.value.status_code == 403, (path, origin)
            assert json.loads(info.value.body)["error"]["code"] == "forbidden"
    assert "runner_w" not in server.state.registry.online
    async with open_websocket_url(ws_base + f"/v1/sessions/{sid}/ws",
                                  extra_headers=[("Origin", "omnigent://internal")]) as ws:
        assert json.loads(await ws.get_message())["type"] == "session.heartbeat"


async def test_host_names_are_checked(server):
    async with httpx.AsyncClient(base_url=server.url) as http:
        for host in ("evil.example", "127.0.0.1.nip.io", "10.1.2.3", "evil.example:" + str(port_of(server.url))):
            resp = await http.get("/v1/sessions", headers={"Host": host})
            assert resp.status_code == 403 and resp.json()["error"]["code"] == "forbidden", host
        for host in ("localhost", f"127.0.0.1:{port_of(server.url)}", "[::1]:80"):
            assert (await http.get("/v1/sessions", headers={"Host": host})).status_code == 200, host


async def test_public_bind_checks_host_against_what_it_serves(nursery, store):
    from omnigent.link.memory import memory_link
    from omnigent.server.serve import run_server
    from omnigent.server.sockets import bind_socket

    server_end, _host_end = memory_link()
    handle = await nursery.start(lambda task_status: run_server(
        store, bind_socket("127.0.0.2"), token=TOKEN, host_links=[server_end], allow_hosts=("Omnigent.Test",),
        task_status=task_status))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with httpx.AsyncClient(base_url=handle.url) as http:
            assert (await http.get("/v1/sessions")).status_code == 401
            for host in ("127.0.0.2", "omnigent.test:443", "127.0.0.2:1", "localhost"):
                assert (await http.get("/v1/sessions", headers={**auth, "Host": host})).status_code == 200, host
            for host in ("evil.example", "10.0.0.1", "proxy.example", ""):
                resp = await http.get("/v1/sessions", headers={**auth, "Host": host})
                assert resp.status_code in (400, 403), host
    finally:
        await handle.aclose()


def test_guard_rules():
    guard = Guard(port=8080, bind_host="0.0.0.0", allow_hosts=frozenset({"proxy.example"}))
    assert guard.origin_refusal(None) is None and guard.origin_refusal("omnigent://internal") is None
    assert guard.origin_refusal("http://127.0.0.1:8080") is None
    for origin in ("null", "", "http://127.0.0.1:8081", "http://proxy.example:8080", "http://[::1", "ws://127.0.0.1:8080"):
        assert guard.origin_refusal(origin), origin
    for host in ("10.2.3.4:8080", "[fe80::1]", "proxy.example", "localhost", "127.0.0.1"):
        assert guard.host_refusal(host) is None, host  # wildcard bind: any address literal
    for host in ("evil.example", "", "[::1", "a:b", None):
        assert guard.host_refusal(host), host
    narrow = Guard(port=1, bind_host="192.0.2.7")
    assert narrow.host_refusal("192.0.2.7") is None
    assert narrow.host_refusal("192.0.2.8") and narrow.host_refusal("127.0.0.1")  # loopback is not served
    local = Guard(port=1)
    assert local.host_refusal("localhost:1") is None and local.host_refusal("10.2.3.4")


async def test_client_token_opens_client_routes_only(nursery, store, bundle):
    handle = await start_server(nursery, store, runner_wait=1.0)
    handle.state.token = TOKEN  # as `omnigent server --token`
    handle.state.credential_wait = 0.5  # an unknown id is refused after this
    ws_base = "ws" + handle.url[4:]
    try:
        async with httpx.AsyncClient(base_url=handle.url) as http:
            assert (await http.get("/v1/sessions")).status_code == 401
            assert (await http.get("/v1/sessions", headers={"Authorization": "Bearer nope"})).status_code == 401
            assert (await http.get("/health")).status_code == 200
            for _ in range(5):  # refused bodies are never read, and the client keeps being answered
                assert (await http.post("/v1/runners", json={"runner_id": "runner_x"})).status_code == 401
            assert (await http.get("/health")).status_code == 200
        async with OmnigentClient(handle.url, token=TOKEN) as client:
            sid = (await client.create_session(bundle))["id"]
            with pytest.raises(ConnectionRejected) as info:
                async with open_websocket_url(f"{ws_base}/v1/sessions/{sid}/ws"):
                    pass
            assert info.value.status_code == 401
            # the client token never opens a runner route, not even for a new id
            async with open_websocket_url(f"{ws_base}/v1/runners/runner_new/ws",
                                          extra_headers=[("Authorization", f"Bearer {TOKEN}")]) as ws:
                await ws.send_message(p.encode(p.Hello(runner_id="runner_new", pid=1,
                                                       protocol_version=p.PROTOCOL_VERSION, harnesses=[])))
                with pytest.raises(ConnectionClosed) as closed:
                    await ws.get_message()
                assert closed.value.reason.code == 4003
            assert await client.list_runners() == []
    finally:
        await handle.aclose()


async def test_explicit_runners_are_registered_by_clients_and_serve_only_their_sessions(server, bundle):
    async with OmnigentClient(server.url) as client, httpx.AsyncClient(base_url=server.url) as http:
        minted = await http.post("/v1/runners", json={})
        assert minted.status_code == 201
        creds = minted.json()
        assert creds["runner_id"].startswith("runner_") and len(creds["runner_secret"]) >= 32
        chosen = {"runner_id": "runner_mine", "runner_secret": "s" * 40}
        assert (await http.post("/v1/runners", json=chosen)).json() == chosen
        again = await http.post("/v1/runners", json={"runner_id": "runner_mine"})
        assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
        for body in ({"runner_id": "x y"}, {"runner_id": 5}, {"runner_secret": "short"}, {"other": 1}):
            resp = await http.post("/v1/runners", json=body)
            assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_input", body
        async with fake_runner(server, "runner_mine", secret=chosen["runner_secret"], reply="mine") as mine:
            [listed] = await client.list_runners()
            assert listed["runner_id"] == "runner_mine" and listed["explicit"] is True
            unbound = (await client.create_session(bundle))["id"]
            with trio.fail_after(10):
                result = await client.run_turn(unbound, "placed anywhere?")
            assert result.status == "failed" and result.error["code"] == "runner_unavailable"
            async with fake_runner(server, "runner_host", reply="host") as placed:
                for _ in range(3):
                    sid = (await client.create_session(bundle))["id"]
                    assert (await client.run_turn(sid, "q")).text == "host"
                assert mine["turns"] == [] and len(placed["turns"]) == 3
                bound = (await client.create_session(bundle))["id"]
                await client.bind_runner(bound, "runner_mine")
                assert (await client.run_turn(bound, "for you")).text == "mine"
                assert [t.session_id for t in mine["turns"]] == [bound]
        # a registered id is not available to another secret
        rival = "ws" + server.url[4:] + "/v1/runners/runner_mine/ws"
        async with open_websocket_url(rival, extra_headers=[("Authorization", "Bearer " + "t" * 40)]) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                await ws.get_message()
            assert closed.value.reason.code == 4003
