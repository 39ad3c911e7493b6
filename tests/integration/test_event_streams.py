"""Replayable streams over real sockets: SSE ids and `Last-Event-ID`, the websocket's `?after=`,
replay after a server restart on the same store, and a turn left by a dead process announced."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager

import httpx
import trio
from trio_websocket import open_websocket_url

from protocol import events as ev
from omnigent.client import OmnigentClient
from omnigent.store import Store
from tests.integration.test_server_api import bundle, fake_runner, start_server  # noqa: F401

LIMIT = 20


async def sse_events(url: str, sid: str, *, until: int, params=None, headers=None) -> list[tuple[str | None, dict]]:
    """(id line, event) pairs of one SSE connection, up to the event numbered `until`."""
    out: list[tuple[str | None, dict]] = []
    async with httpx.AsyncClient(base_url=url, timeout=LIMIT) as http:
        async with http.stream("GET", f"/v1/sessions/{sid}/stream", params=params or {},
                               headers=headers or {}) as resp:
            assert resp.status_code == 200
            event_id = None
            async for line in resp.aiter_lines():
                if line.startswith("id: "):
                    event_id = line[4:]
                elif line.startswith("data: {"):
                    event = json.loads(line[6:])
                    out.append((event_id, event))
                    event_id = None
                    if event.get("sequence_number") == until and event["type"] != ev.HEARTBEAT:
                        return out
    return out


async def one_turn(server, sid: str) -> int:
    async with OmnigentClient(server.url) as client:
        with trio.fail_after(LIMIT):
            result = await client.run_turn(sid, "hello")
        assert result.status == "completed"
        return (await client.get_session(sid))["last_sequence_number"]


@asynccontextmanager
async def _served_session(nursery, tmp_path, bundle):  # noqa: F811
    """A server on a fresh store, a fake runner online, and one session: (server, session id)."""
    store = Store(tmp_path / "chat.db")
    server = await start_server(nursery, store, runner_wait=2.0)
    try:
        async with fake_runner(server):
            async with OmnigentClient(server.url) as client:
                sid = (await client.create_session(bundle))["id"]
            yield server, sid
    finally:
        await server.aclose()
        store.close()


async def test_sse_sends_ids_and_honours_last_event_id_and_after(nursery, tmp_path, bundle):  # noqa: F811
    async with _served_session(nursery, tmp_path, bundle) as (server, sid):
        last = await one_turn(server, sid)
        with trio.fail_after(LIMIT):
            full = await sse_events(server.url, sid, until=last, params={"after": 0})
        greeting, *logged = full
        assert greeting == (None, {"type": ev.HEARTBEAT, "session_id": sid, "sequence_number": last})
        assert [int(i) for i, _ in logged] == [e["sequence_number"] for _, e in logged] == list(range(1, last + 1))
        with trio.fail_after(LIMIT):
            resumed = await sse_events(server.url, sid, until=last, headers={"Last-Event-ID": "3"})
        assert [e["sequence_number"] for _, e in resumed[1:]] == list(range(4, last + 1))
        with trio.fail_after(LIMIT):  # ?after= wins over the header
            both = await sse_events(server.url, sid, until=last, params={"after": last - 1},
                                    headers={"Last-Event-ID": "1"})
        assert [e["sequence_number"] for _, e in both[1:]] == [last]
        async with httpx.AsyncClient(base_url=server.url) as http:
            bad = await http.get(f"/v1/sessions/{sid}/stream", headers={"Last-Event-ID": "x"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_input"


async def test_websocket_after_replays_then_tails_with_no_gap_or_duplicate(nursery, tmp_path, bundle):  # noqa: F811
    store = Store(tmp_path / "chat.db")
    server = await start_server(nursery, store, runner_wait=2.0)
    try:
        async with fake_runner(server):
            async with OmnigentClient(server.url) as client:
                sid = (await client.create_session(bundle))["id"]
            first = await one_turn(server, sid)
            ws_url = "ws" + server.url[4:] + f"/v1/sessions/{sid}/ws?after=2"
            seen: list[int] = []
            with trio.fail_after(LIMIT):
                async with open_websocket_url(ws_url) as ws:
                    greeting = json.loads(await ws.get_message())
                    assert greeting["type"] == ev.HEARTBEAT and greeting["sequence_number"] == first
                    while not seen or seen[-1] < first:
                        seen.append(json.loads(await ws.get_message())["sequence_number"])
                    async with trio.open_nursery() as n:  # the live tail: the next turn
                        n.start_soon(one_turn, server, sid)
                        while True:
                            event = json.loads(await ws.get_message())
                            seen.append(event["sequence_number"])
                            if event["type"] == ev.SESSION_STATUS and event["status"] == "idle":
                                break
            assert seen == list(range(3, seen[-1] + 1)) and seen[-1] > first
    finally:
        await server.aclose()
        store.close()


async def test_replay_after_a_server_restart_and_a_dead_process_turn_is_announced(nursery, tmp_path, bundle):  # noqa: F811
    path = tmp_path / "chat.db"
    store = Store(path)
    server = await start_server(nursery, store, runner_wait=2.0)
    async with fake_runner(server):
        async with OmnigentClient(server.url) as client:
            sid = (await client.create_session(bundle))["id"]
        last = await one_turn(server, sid)
    await server.aclose()
    store.close()
    with Store(path) as store:  # a turn a process that is gone left running
        _, turn = store.queue_message(sid, {"type": "message", "role": "user", "content": "lost"})
        store.db.execute("UPDATE turns SET status = 'running', owner_pid = 999999999 WHERE id = ?", [turn["id"]])
        store.conn.commit()
    store = Store(path)
    server = await start_server(nursery, store, runner_wait=2.0)
    try:
        with trio.fail_after(LIMIT):
            events = await sse_events(server.url, sid, until=last + 2, params={"after": 0})
        logged = [e for _, e in events[1:]]
        assert [e["sequence_number"] for e in logged] == list(range(1, last + 3))
        interrupted, status = logged[-2:]
        assert (interrupted["type"], interrupted["turn_id"]) == (ev.TURN_INTERRUPTED, turn["id"])
        assert (status["type"], status["status"]) == (ev.SESSION_STATUS, "idle")
        assert store.get_turn(turn["id"])["status"] == "interrupted"
    finally:
        await server.aclose()
        store.close()


async def test_a_session_from_the_previous_release_gets_a_resync_over_the_websocket(nursery, tmp_path):
    import shutil
    from pathlib import Path

    path = tmp_path / "chat.db"
    shutil.copy(Path(__file__).parent.parent / "resources" / "stores" / "chat-0.1.0.db", path)
    store = Store(path)
    server = await start_server(nursery, store, runner_wait=2.0)
    try:
        sid = store.list_conversations(limit=1)[0]["id"]
        ws_url = "ws" + server.url[4:] + f"/v1/sessions/{sid}/ws?after=0"
        with trio.fail_after(LIMIT):
            async with open_websocket_url(ws_url) as ws:
                greeting = json.loads(await ws.get_message())
                resync = json.loads(await ws.get_message())
        assert greeting["type"] == ev.HEARTBEAT and greeting["sequence_number"] == 0
        assert (resync["type"], resync["reason"], resync["sequence_number"]) == (ev.RESYNC, "before_log", 0)
        assert resync["items"] == store.list_items(sid) and resync["session"]["id"] == sid
    finally:
        await server.aclose()
        store.close()


async def test_an_sse_stream_outlives_the_frameworks_response_timeout(nursery, tmp_path, bundle,  # noqa: F811
                                                                      monkeypatch):
    """quart ends a response after its RESPONSE_TIMEOUT (60 s) unless the response sets its own:
    every follower of a session over SSE (the SDK, the REPL, `attach`, curl) was cut off after a
    minute ("incomplete chunked read"). With that bound shortened to 0.3 s, a stream opened
    before it ran out still delivers the turn posted after it."""
    from omnigent.server import app as app_module

    made = app_module.create_app

    def short_bound(*args, **kwargs):
        app = made(*args, **kwargs)
        app.config["RESPONSE_TIMEOUT"] = 0.3
        return app

    monkeypatch.setattr(app_module, "create_app", short_bound)
    async with _served_session(nursery, tmp_path, bundle) as (server, sid):
        with trio.fail_after(LIMIT):
            async with httpx.AsyncClient(base_url=server.url, timeout=LIMIT) as http:
                async with http.stream("GET", f"/v1/sessions/{sid}/stream") as resp:
                    lines = resp.aiter_lines()
                    async for line in lines:  # the greeting: the stream is open
                        if line.startswith("data: {"):
                            assert json.loads(line[6:])["type"] == ev.HEARTBEAT
                            break
                    await trio.sleep(0.6)  # twice the bound: not a wait for anything, time passing
                    last = await one_turn(server, sid)
                    seen = []
                    async for line in lines:
                        if line.startswith("data: {"):
                            seen.append(json.loads(line[6:])["sequence_number"])
                            if seen[-1] == last:
                                break
        assert seen[-1] == last
