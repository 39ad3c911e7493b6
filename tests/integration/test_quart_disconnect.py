"""Clients that leave a websocket end its handler quietly, on quart 0.22 and 0.23 alike.

quart 0.23 (what pip picks on Python 3.13) raises `ClientDisconnectedError` from a
websocket's receive/send once the client is gone, and logs it as an ERROR traceback when
it leaves a handler (stack-notes G3); 0.22 just cancels the handler. `.ci/run`'s second
leg runs this on 3.13. A watcher and a runner connect over real sockets, go away, and the
server is stopped (so every handler has ended): no ERROR was logged.
"""

from __future__ import annotations

import logging

import trio
from trio_websocket import open_websocket_url

from omnigent.client import OmnigentClient
from omnigent.store import Store
from tests.integration.test_server_api import bundle, fake_runner, start_server  # noqa: F401

LIMIT = 20


async def test_watchers_and_runners_that_leave_log_no_error(nursery, tmp_path, bundle, caplog):  # noqa: F811
    caplog.set_level(logging.WARNING)
    store = Store(tmp_path / "chat.db")
    server = await start_server(nursery, store, runner_wait=2.0)
    try:
        with trio.fail_after(LIMIT):
            async with fake_runner(server):
                async with OmnigentClient(server.url) as client:
                    sid = (await client.create_session(bundle))["id"]
                    result = await client.run_turn(sid, "hello")
                    assert result.status == "completed"
                ws_url = "ws" + server.url[4:] + f"/v1/sessions/{sid}/ws?after=0"
                async with open_websocket_url(ws_url) as ws:
                    await ws.get_message()  # the greeting heartbeat: the handler is in its loop
                # the runner leaves too (fake_runner closes its socket)
    finally:
        with trio.fail_after(LIMIT):
            await server.aclose()
        store.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
