"""Seeded fuzz of the whole API: no input gets a 5xx, and nothing stalls the server.

The server runs for real (`run_server` on a socket, with its store). The bulk
of the inputs goes through quart's in-process test client on an app built
from the same state (fast); websockets and the heavy cases (bodies past every
limit, frames past hypercorn's, tarballs and YAML that once held the loop for
seconds) go over the socket. Meanwhile a well-behaved client keeps calling
the API and must be answered each time within a bound. At the end the server
must still answer and the store must pass its integrity check.

A failure names the seed and the input's index: `OMNIGENT_FUZZ_SEED=<seed>`
reruns the same inputs, and `inputs.case(seed, index, ...)` rebuilds one.
`scripts/bench_fuzz.py` runs the same inputs and prints the figures.
"""

from __future__ import annotations

import logging
import os
from urllib.parse import urlsplit

import httpx
import pytest
import trio

from omnigent.server.app import create_app
from omnigent.server.serve import run_server
from omnigent.server.sockets import bind_socket
from omnigent.store import Store

from .driver import (ErrorLog, Tally, final_checks, make_targets, raw_request, run_inproc, run_ws, steady_client,
                     with_approval)
from .inputs import WS_SHARE, HttpCase, case, heavy_cases, routes_of

TOKEN = "fuzz-token"
SEED = int(os.environ.get("OMNIGENT_FUZZ_SEED", "20261201"))


def _hosts_and_files(route) -> bool:
    return route.rule.startswith("/v1/hosts") or "/files" in route.rule


def _approval_routes(route) -> bool:
    return "/approvals" in route.rule or "/permissions" in route.rule


def _approvals(route) -> bool:
    """The approval routes and the routes whose bodies gained approval fields."""
    return _approval_routes(route) or route.rule.endswith("/events") or route.rule in (
        "/v1/sessions", "/v1/sessions/<session_id>")


async def fuzz(tmp_path, *, seed: int, count: int, heavy: bool, only=None, ws_share: float = WS_SHARE,
               auth_share: float = 0.05, approval: bool = True) -> Tally:
    db = tmp_path / "chat.db"
    store = Store(db)
    tally = Tally()
    watch = ErrorLog(tally)
    root = logging.getLogger()
    root.addHandler(watch)
    try:
        async with trio.open_nursery() as nursery:
            server = await nursery.start(lambda task_status: run_server(
                store, bind_socket(), token=TOKEN, runner_wait=0.3, ping_interval=0.2,
                task_status=task_status))
            server.state.launch_timeout = 0.2  # a host link the fuzz left open never answers a launch
            targets = await make_targets(server.url, TOKEN)
            if approval:  # a pending approval and a rule to aim at (see inputs._approval_templates)
                targets = with_approval(store, targets)
            app = create_app(server.state)
            routes = [r for r in routes_of(app) if only is None or only(r)]
            client = app.test_client()
            stop = trio.Event()
            nursery.start_soon(steady_client, server.url, targets, tally, stop)
            for index in range(count):
                one = case(seed, index, routes, targets, ws_share=ws_share, auth_share=auth_share)
                where = f"seed {seed} index {index} ({one.label})"
                if isinstance(one, HttpCase):
                    await run_inproc(client, one, tally, where)
                else:
                    await run_ws(server.url, one, tally, where)
            if heavy:
                url = urlsplit(server.url)
                for index, one in enumerate(heavy_cases(targets)):
                    where = f"heavy case {index} ({one.label})"
                    if isinstance(one, HttpCase):
                        await raw_request(url.hostname, url.port, one, tally, where)
                    else:
                        await run_ws(server.url, one, tally, where)
            stop.set()
            await final_checks(server.url, db, tally)
            await server.aclose()
    finally:
        root.removeHandler(watch)
        store.close()
    return tally


def _report(tally: Tally, seed: int) -> str:
    shown = "\n".join(tally.failures[:20])
    return (f"{len(tally.failures)} failed checks in {tally.inputs} inputs (seed {seed}; rerun with "
            f"OMNIGENT_FUZZ_SEED={seed}):\n{shown}")


@pytest.mark.slow  # out of the default run (the full fuzz covers every route too) to keep it under 5 minutes; .ci/run runs it
async def test_quick_fuzz_every_route(tmp_path):
    # the host routes have their own quick fuzz below (most of its inputs authorized); kept out
    # here so this seed's inputs stay those it always was
    tally = await fuzz(tmp_path, seed=SEED, count=800, heavy=False, approval=False,
                       only=lambda route: not route.rule.startswith("/v1/hosts") and not _approval_routes(route))
    assert not tally.failures, _report(tally, SEED)
    assert tally.steady, "the well-behaved client never got through"
    assert {status for status in tally.http if 400 <= status < 500} >= {400, 404, 405, 413, 415}


async def test_quick_fuzz_hosts_and_files(tmp_path):
    """`/v1/hosts*`, the host websocket (junk, wrong order, wrong secret) and the file routes."""
    tally = await fuzz(tmp_path, seed=SEED + 7, count=400, heavy=False, only=_hosts_and_files, ws_share=0.25,
                       auth_share=0.9)
    assert not tally.failures, _report(tally, SEED + 7)
    assert {"closed 4003", "closed 4000"} <= set(tally.ws), tally.ws
    assert {201, 400, 404} <= set(tally.http), tally.http


async def test_quick_fuzz_approvals(tmp_path):
    """Approval answers, approval timeouts, permission modes, the approvals and permissions routes."""
    tally = await fuzz(tmp_path, seed=SEED + 9, count=400, heavy=False, only=_approvals, ws_share=0.0,
                       auth_share=0.9)
    assert not tally.failures, _report(tally, SEED + 9)
    assert {200, 202, 400, 404, 409} <= set(tally.http), tally.http  # 409: the approval answered again


@pytest.mark.slow
async def test_full_fuzz_of_hosts_and_files(tmp_path):
    tally = await fuzz(tmp_path, seed=SEED + 8, count=5_000, heavy=False, only=_hosts_and_files, ws_share=0.3,
                       auth_share=0.9)
    assert not tally.failures, _report(tally, SEED + 8)
    assert tally.steady


@pytest.mark.slow
async def test_full_fuzz_with_heavy_cases(tmp_path):
    tally = await fuzz(tmp_path, seed=SEED + 1, count=10_000, heavy=True)
    assert tally.inputs >= 10_000
    assert not tally.failures, _report(tally, SEED + 1)
    assert tally.steady


async def test_text_plain_post_is_refused_before_it_runs(tmp_path):
    """A web page's CORS simple request (text/plain, no preflight) must not post a message."""
    store = Store(tmp_path / "chat.db")
    async with trio.open_nursery() as nursery:
        server = await nursery.start(lambda task_status: run_server(
            store, bind_socket(), token=TOKEN, runner_wait=0.3, task_status=task_status))
        targets = await make_targets(server.url, TOKEN)
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            before = len(store.list_items(targets.session_id))
            body = b'{"type": "message", "data": {"role": "user", "content": "from a web page"}}'
            for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
                headers = {"Content-Type": ctype} if ctype else {}
                resp = await http.post(f"/v1/sessions/{targets.session_id}/events", content=body, headers=headers)
                assert resp.status_code == 415, resp.text
                assert resp.json()["error"]["code"] == "unsupported_media_type"
            assert len(store.list_items(targets.session_id)) == before
            ok = await http.post(f"/v1/sessions/{targets.session_id}/events", content=body,
                                 headers={"Content-Type": "application/json; charset=utf-8"})
            assert ok.status_code == 202, ok.text
            resp = await http.get(f"/v1/sessions/{targets.session_id}/items", params={"after": "msg_unknown"})
            assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_input"
        await server.aclose()
    store.close()
