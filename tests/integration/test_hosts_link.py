"""Hosts over real sockets: the routes, the host websocket and `run_host_link`.

A real server (`run_server` on a real socket, no in-process host) and the
real client link; the "host" on the far end is either a test that reads the
frames itself or a small fake that answers `LaunchRunner`.
"""

from __future__ import annotations

import os

import httpx
import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

import protocol as p
from omnigent.host.ws_link import HostRevoked, host_ws_url, run_host_link
from omnigent.link.memory import memory_link
from omnigent.link.runner_secrets import hash_secret, mint_secret
from omnigent.server.serve import run_server
from omnigent.server.sockets import bind_socket
from omnigent.store import Store


@pytest.fixture
async def server(nursery, tmp_path):
    store = Store(tmp_path / "chat.db")
    handle = await nursery.start(lambda task_status: run_server(
        store, bind_socket(), token=None, runner_wait=2.0, ping_interval=0.2, task_status=task_status))
    handle.store = store
    yield handle
    await handle.aclose()
    store.close()


async def register(server, **body) -> tuple[str, str]:
    async with httpx.AsyncClient(base_url=server.url) as http:
        r = await http.post("/v1/hosts", json=body)
    assert r.status_code == 201, r.text
    data = r.json()
    return data["host_id"], data["host_secret"]


def hello_for(host_id: str, **kw):
    return lambda: p.HostHello(host_id=host_id, pid=os.getpid(), protocol_version=p.PROTOCOL_VERSION, **kw)


async def test_register_stores_only_the_hash(server):
    host_id, secret = await register(server, name="box", workspace_roots=["/srv/work"], capacity=2)
    assert host_id.startswith("host_") and len(host_id) == 37
    row = server.store.get_host(host_id)
    assert row["secret_hash"] == hash_secret(secret)
    dump = "\n".join(server.store.conn.iterdump())
    assert secret not in dump
    async with httpx.AsyncClient(base_url=server.url) as http:
        host = (await http.get(f"/v1/hosts/{host_id}")).json()
        assert host == {"host_id": host_id, "name": "box", "status": "offline", "online": False, "runners": [],
                        "capacity": 2, "workspace_roots": ["/srv/work"], "generation": 0, "last_seen_at": None}
        listed = (await http.get("/v1/hosts")).json()
        assert listed["object"] == "list" and [h["host_id"] for h in listed["data"]] == [host_id]


async def test_link_connects_and_revoke_ends_it(server, nursery):
    host_id, secret = await register(server)
    server_end, host_end = memory_link()
    outcome: dict = {}

    async def link():
        try:
            await run_host_link(server.url, host_id, secret, server_end, hello_for(host_id), backoff_cap=0.2,
                                task_status=started)
        except HostRevoked as exc:
            outcome["revoked"] = str(exc)

    started = trio.TASK_STATUS_IGNORED
    async with trio.open_nursery() as n:
        async def run(task_status=trio.TASK_STATUS_IGNORED):
            nonlocal started
            started = task_status
            await link()
        ack = await n.start(run)
        assert isinstance(ack, p.HostHelloAck) and ack.generation == 1
        async with httpx.AsyncClient(base_url=server.url) as http:
            host = (await http.get(f"/v1/hosts/{host_id}")).json()
            assert host["online"] is True and host["status"] == "online" and host["generation"] == 1
            r = await http.delete(f"/v1/hosts/{host_id}")
            assert r.json() == {"host_id": host_id, "revoked": True}
            with trio.fail_after(10):
                while "revoked" not in outcome:
                    await trio.sleep(0.02)
            assert (await http.get(f"/v1/hosts/{host_id}")).status_code == 404
            assert [h for h in (await http.get("/v1/hosts")).json()["data"] if h["host_id"] == host_id] == []
    assert "revoked" in outcome["revoked"] or "refused" in outcome["revoked"]


async def test_wrong_secret_is_4003(server):
    host_id, _ = await register(server)
    url = host_ws_url(server.url, host_id)
    async with open_websocket_url(url, extra_headers=[("Authorization", "Bearer nope")]) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            await ws.get_message()
    assert closed.value.reason.code == 4003
    server_end, _ = memory_link()
    with trio.fail_after(10), pytest.raises(HostRevoked):
        await run_host_link(server.url, host_id, mint_secret(), server_end, hello_for(host_id))


async def test_host_bodies_are_strict(server):
    async with httpx.AsyncClient(base_url=server.url) as http:
        for body in ({"name": 5}, {"workspace_roots": "/srv"}, {"workspace_roots": ["relative"]},
                     {"capacity": -1}, {"capacity": True}, {"capacity": 1.5}, {"bogus": 1}, [1]):
            r = await http.post("/v1/hosts", json=body)
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_input", (body, r.text)
        r = await http.post("/v1/hosts", content=b"{}", headers={"Content-Type": "text/plain"})
        assert r.status_code == 415
        for method, path in (("GET", "/v1/hosts/host_nope"), ("DELETE", "/v1/hosts/host_nope"),
                             ("GET", "/v1/hosts/nope"), ("POST", "/v1/hosts/host_nope/runners")):
            r = await http.request(method, path, json={} if method == "POST" else None)
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", (method, path)
        host_id, _ = await register(server)
        r = await http.post(f"/v1/hosts/{host_id}/runners", json={"workspace": "rel"})
        assert r.status_code == 400
        r = await http.post(f"/v1/hosts/{host_id}/runners", json={"extra": 1})
        assert r.status_code == 400


async def test_sessions_record_their_host(server, tmp_path):
    from omnigent.agents import bundle_bytes

    agent = tmp_path / "a.yaml"
    agent.write_text("name: host_agent\nprompt: p\nexecutor:\n  model: m\n")
    host_id, _ = await register(server)
    async with httpx.AsyncClient(base_url=server.url) as http:
        meta = '{"host_id": "%s", "workspace": "/srv/w"}' % host_id
        r = await http.post("/v1/sessions", data={"metadata": meta},
                            files={"bundle": ("a.tar.gz", bundle_bytes(agent))})
        assert r.status_code == 201, r.text
        sid = r.json()["session_id"]
        got = (await http.get(f"/v1/sessions/{sid}")).json()
        assert got["host_id"] == host_id and got["workspace"] == "/srv/w"
        r = await http.post("/v1/sessions", json={"agent_id": r.json()["agent_id"]})
        assert (await http.get(f"/v1/sessions/{r.json()['id']}")).json()["host_id"] is None
        r = await http.post("/v1/sessions", data={"metadata": '{"host_id": "host_nope"}'},
                            files={"bundle": ("a.tar.gz", bundle_bytes(agent))})
        assert r.status_code == 404
        r = await http.post("/v1/sessions", data={"metadata": '{"host_id": 5}'},
                            files={"bundle": ("a.tar.gz", bundle_bytes(agent))})
        assert r.status_code == 400


async def test_browsers_cannot_open_the_host_websocket(server):
    host_id, secret = await register(server)
    url = host_ws_url(server.url, host_id)
    for origin in ("https://evil.example", "null"):
        with pytest.raises(ConnectionRejected) as refused:
            async with open_websocket_url(url, extra_headers=[("Authorization", f"Bearer {secret}"),
                                                              ("Origin", origin)]):
                pass
        assert refused.value.status_code == 403


async def test_the_in_process_host_is_listed_and_cannot_be_revoked(nursery, tmp_path):
    store = Store(tmp_path / "chat.db")
    server_end, _host_end = memory_link()
    handle = await nursery.start(lambda task_status: run_server(
        store, bind_socket(), token=None, host_links=[server_end], task_status=task_status))
    try:
        async with httpx.AsyncClient(base_url=handle.url) as http:
            listed = (await http.get("/v1/hosts")).json()["data"]
            assert [h["host_id"] for h in listed] == ["host_local"] and listed[0]["online"] is True
            assert (await http.get("/v1/hosts/host_local")).json()["status"] == "online"
            r = await http.delete("/v1/hosts/host_local")
            assert r.status_code == 403
    finally:
        await handle.aclose()
        store.close()


async def test_the_link_answers_pings_itself_and_stays_up(nursery, tmp_path):
    store = Store(tmp_path / "chat.db")
    handle = await nursery.start(lambda task_status: run_server(
        store, bind_socket(), token=None, ping_interval=0.05, ping_allowance=3.0, task_status=task_status))
    host_id, secret = await register(handle)
    server_end, _host_end = memory_link()  # a pool that never reads or writes: the link still answers
    scope = trio.CancelScope()

    async def link(task_status=trio.TASK_STATUS_IGNORED):
        with scope:
            await run_host_link(handle.url, host_id, secret, server_end, hello_for(host_id), task_status=task_status)

    try:
        ack = await nursery.start(link)
        conn = handle.state.registry.hosts[host_id]
        first = conn.last_pong
        with trio.fail_after(10):
            while conn.last_pong < first + 20 * 0.05:  # pongs for 20 ping intervals, 3 allowed silent
                await trio.sleep(0.05)
        assert handle.state.registry.hosts[host_id] is conn and store.get_host(host_id)["generation"] == ack.generation
    finally:
        scope.cancel()
        await handle.aclose()
        store.close()
