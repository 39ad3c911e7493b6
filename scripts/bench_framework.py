"""Benchmark: what the stack costs per operation before any omnigent code runs (issue 10).

`scripts/bench_sessions.py` measures omnigent's CPU per turn against a per-turn floor.
This script measures how much of that the server's framework takes on its own. Each
server below is a child process running hypercorn on trio, one at a time, and does
nothing but the operation:

  - quart POST: a quart-trio route that parses a JSON body and answers with JSON
    (the shape of `POST /v1/sessions/{id}/events`);
  - raw ASGI POST: the same exchange as a bare ASGI app on hypercorn, with no quart
    (and the websocket round trip below, likewise): what quart itself adds;
  - quart websocket round trip: a quart-trio websocket route that answers each text
    message with one (the runner link: a lone turn sends a TurnStart and gets an
    item-done event and a TurnCompleted back);
  - quart SSE chunk: a streaming response that yields one small chunk at a time
    (a lone turn's stream writes 4 bursts);
  - the raw ASGI POST and round trip again on omnigent's hypercorn connections
    (`omnigent/server/connections.py`), as `omnigent server` serves them.

The client is this process: httpx for HTTP and trio-websocket for the websocket.
Each figure is the server's CPU per operation (utime+stime from /proc) over the
per-turn floor's CPU per call, timed in the same run
(`bench_sessions.floor`: one warm trio process making the same `openai` call to the
mock). The last line adds these costs up as a lone turn uses them: the share of a
turn's CPU that the framework takes whatever omnigent does.

Prints figures; asserts nothing.

Usage: python scripts/bench_framework.py [--ops 2000] [--floor-calls 100]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sessions import floor, start_mock, tree_cpu  # noqa: E402  (a sibling script)

_SERVER = r'''
import sys, trio
from hypercorn.config import Config
from hypercorn.trio import serve
from quart import jsonify, request, websocket
from quart_trio import QuartTrio

app = QuartTrio(__name__)

@app.post("/v1/sessions/<sid>/events")
async def post(sid):
    body = await request.get_json()
    return jsonify({"session_id": sid, "turn_id": "turn_x", "type": body.get("type")}), 202

@app.websocket("/ws")
async def ws():
    while True:
        await websocket.send(await websocket.receive())

@app.get("/sse")
async def sse():
    n = int(request.args["n"])
    async def body():
        for i in range(n):
            yield b'data: {"type": "session.status", "sequence_number": %d}\n\n' % i
            await trio.lowlevel.checkpoint()
    return body(), {"Content-Type": "text/event-stream"}

async def raw(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            kind = "startup" if message["type"] == "lifespan.startup" else "shutdown"
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        while True:
            message = await receive()
            if message["type"] != "websocket.receive":
                return
            await send({"type": "websocket.send", "text": message["text"]})
    while (await receive()).get("more_body"):
        pass
    body = b'{"session_id": "s", "turn_id": "turn_x", "type": "message"}'
    await send({"type": "http.response.start", "status": 202,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})

if sys.argv[2:] == ["connections"]:  # omnigent's hypercorn connections (omnigent/server/connections.py)
    from omnigent.server import connections
    assert connections.install()
    config = connections.Config()
else:
    config = Config()
config.bind = ["127.0.0.1:0"]
config.accesslog = None
config.errorlog = None

async def main():
    async with trio.open_nursery() as nursery:
        (url,) = await nursery.start(serve, app if sys.argv[1] == "quart" else raw, config)
        print(url, flush=True)

trio.run(main)
'''


def _start(kind: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, *kind.split()], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return proc, proc.stdout.readline().strip()


def _per_op(pid: int, ops: int, run) -> float:
    before = tree_cpu(pid)[pid]
    run()
    return (tree_cpu(pid)[pid] - before) / ops


def _posts(url: str, ops: int) -> None:
    import httpx

    with httpx.Client(base_url=url) as client:
        for _ in range(ops):
            client.post("/v1/sessions/s/events", json={"type": "message", "data": {"role": "user"}})


def _round_trips(url: str, ops: int) -> None:
    import trio
    from trio_websocket import open_websocket_url

    async def go() -> None:
        async with open_websocket_url(f"ws{url[4:]}/ws") as ws:
            for _ in range(ops):
                await ws.send_message('{"type": "turn.start", "turn_id": "turn_x"}')
                await ws.get_message()

    trio.run(go)


def _chunks(url: str, ops: int) -> None:
    import httpx

    with httpx.stream("GET", f"{url}/sse", params={"n": ops}, timeout=60) as response:
        for _ in response.iter_raw():
            pass


def measure(kind: str, ops: int, run) -> float:
    proc, url = _start(kind)
    try:
        run(url, min(200, ops))  # warm-up
        return _per_op(proc.pid, ops, lambda: run(url, ops))
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--floor-calls", type=int, default=100)
    args = parser.parse_args()
    mock, mock_url = start_mock(50)
    try:
        before = floor(mock_url, args.floor_calls)["cpu"]
        figures = [
            ("quart POST", measure("quart", args.ops, _posts), 1),
            ("raw ASGI POST (no quart)", measure("raw", args.ops, _posts), 0),
            ("quart websocket round trip (a message in, one out)", measure("quart", args.ops, _round_trips), 1.5),
            ("raw ASGI websocket round trip (no quart)", measure("raw", args.ops, _round_trips), 0),
            ("raw ASGI POST, omnigent's hypercorn connections", measure("raw connections", args.ops, _posts), 0),
            ("raw ASGI websocket round trip, omnigent's connections", measure("raw connections", args.ops,
                                                                             _round_trips), 0),
            ("quart SSE chunk", measure("quart", args.ops, _chunks), 4),
        ]
        after = floor(mock_url, args.floor_calls)["cpu"]
    finally:
        mock.terminate()
        mock.wait()
    floor_cpu = (before + after) / 2
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; {args.ops} operations each")
    print(f"per-turn floor: CPU {floor_cpu * 1000:.2f} ms per call (before/after: {before * 1000:.2f} / "
          f"{after * 1000:.2f})")
    print()
    print("| server operation | CPU per operation | × the floor's CPU per call | per lone turn |")
    print("| --- | --- | --- | --- |")
    for what, cpu, per_turn in figures:
        print(f"| {what} | {cpu * 1000:.3f} ms | {cpu / floor_cpu:.3f}× | {per_turn:g} |")
    turn = sum(cpu * n for _, cpu, n in figures)
    print()
    print(f"the framework's own CPU for one lone turn (the last column's counts): {turn * 1000:.2f} ms = "
          f"{turn / floor_cpu:.2f}× the floor's CPU per call, before omnigent's code and its store")


if __name__ == "__main__":
    started = time.monotonic()
    main()
    print(f"({time.monotonic() - started:.0f} s)")
