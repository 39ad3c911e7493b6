"""Figures: many clients watching one session over SSE, against the stored event log.

An in-process server on a temporary store (its hub batching deltas as in
production). For each watcher count W it opens W SSE streams on one
session, waits for every greeting, then publishes N text deltas on the hub
(in bursts of 20, yielding between them, as a runner's frames arrive) and a
final `session.status`, and times until every watcher has read the final
event. It prints, per W:
  - events delivered per second (W x N / time), and that as a ratio to the floor's rate;
  - overhead per watcher: (time(W) - floor) / W, in ms and as a ratio to the floor.

The floor is the same N events published and stored with no watcher, timed
in the same run: what the server pays whoever watches (numbering, the
batched store writes), so the ratios isolate what watching adds, and
machine noise (2 shared cores) hits floor and figures alike. Server and
watchers share one process, so the figures are total CPU per delivery.
Two more figures, for `--delay-watchers` (100) clients:
  - delay from publish to delivery: deltas published at a steady `--rate` (500 events/s: a
    fast model's text), each watcher notes when each arrives (by the SSE `id:` line); p50 /
    p99 / max over every (watcher, event). The watchers are a child process (one client
    each) on the same 2 cores. It includes the hub's delta batching (at most 20 ms: deltas
    are stored, then sent, in one transaction per 20 ms);
  - memory per watcher: a real `omnigent server --runners 0` process, its PSS
    (/proc/PID/smaps_rollup) before and after W idle watchers are greeted, over W; SSE and
    websocket watchers each on a server of their own (a freed arena would hide the second).
  The delays are also given as ratios to the floor, `python -c "import openai, trio"`, timed
  in the same run.

Asserts nothing. Usage: python scripts/bench_watchers.py [--events 2000] [--watchers 1,10,50,100,200]
       [--delay-watchers 100] [--rate 500] [--delay-s 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_run import floor_seconds  # noqa: E402
from omnigent.server.serve import run_server  # noqa: E402
from omnigent.server.sockets import bind_socket  # noqa: E402
from omnigent.store import Store  # noqa: E402
from protocol import events as ev  # noqa: E402

BURST = 20


async def _watch(http: httpx.AsyncClient, sid: str, greeted: trio.Semaphore, done: list[float]) -> None:
    async with http.stream("GET", f"/v1/sessions/{sid}/stream") as resp:
        first = True
        async for line in resp.aiter_lines():
            if not line.startswith("data: {"):
                continue
            if first:
                first = False
                greeted.release()
                continue
            if '"session.status"' in line:
                done.append(time.perf_counter())
                return


# The watchers of the delay figure: a child process, so that their reading is not done on the
# server's own loop (it shares the 2 cores, as real clients on the machine would). One client
# each (a shared httpx pool looks at every connection per request). perf_counter is
# CLOCK_MONOTONIC on Linux: the same clock in both processes.
WATCHERS_CODE = r"""
import json, re, sys, time
import httpx, trio

ID = re.compile(rb"^id: (\d+)$", re.M)

async def watch(url, sid, greeted, arrivals):
    # Raw chunks, not lines: every event of a chunk arrived at once, and a line parser in
    # Python would make this process, not the server, the bottleneck at 50,000 events/s.
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        async with http.stream("GET", f"/v1/sessions/{sid}/stream") as resp:
            greeting, tail = True, b""
            async for chunk in resp.aiter_raw():
                now = time.perf_counter()
                if greeting:
                    greeting = False
                    greeted.release()
                data = tail + chunk
                cut = data.rfind(b"\n\n") + 2  # whole events only (1: none yet)
                data, tail = (data[:cut], data[cut:]) if cut > 1 else (b"", data)
                arrivals.extend((int(seq), now) for seq in ID.findall(data))
                if b'"session.status"' in data:
                    return


async def main(url, sid, n):
    greeted = trio.Semaphore(0)
    arrivals = [[] for _ in range(n)]
    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(watch, url, sid, greeted, arrivals[i])
        for _ in range(n):
            await greeted.acquire()
        print("ready", flush=True)
    print(json.dumps(arrivals), flush=True)

trio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
"""


async def _lines(stream: trio.abc.ReceiveStream):
    buffer = b""
    while True:
        chunk = await stream.receive_some(1 << 16)
        if not chunk:
            if buffer:
                yield buffer.decode()
            return
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            yield line.decode()


async def _delays(server, store: Store, watchers: int, rate: float, seconds: float) -> list[float]:
    """Publish deltas at `rate` per second; the delay of each (watcher, event), in seconds."""
    sid = store.create_conversation(agent_id=None)["id"]
    published: list[tuple[dict, float]] = []
    proc = await trio.lowlevel.open_process([sys.executable, "-c", WATCHERS_CODE, server.url, sid, str(watchers)],
                                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    try:
        lines = _lines(proc.stdout)
        if await lines.__anext__() != "ready":
            raise SystemExit("the watchers did not start")
        hub = server.state.hub
        next_at = trio.current_time()
        for i in range(int(rate * seconds)):
            await trio.sleep_until(next_at)
            next_at += 1 / rate
            published.append((hub.publish(sid, ev.TEXT_DELTA, turn_id="turn_bench", delta=f"{i:08d}"),
                              time.perf_counter()))
        hub.publish(sid, ev.SESSION_STATUS, status="idle")
        arrivals = json.loads(await lines.__anext__())
        await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    at = {event["sequence_number"]: when for event, when in published}  # numbered once stored
    return [arrived - at[seq] for mine in arrivals for seq, arrived in mine if seq in at]


async def _memory_per_watcher(kind: str, watchers: int) -> float:
    """KiB of the server's PSS per idle watcher of one session (`kind`: sse or ws)."""
    from bench_run import pss_kib
    from bench_sessions import start_server, stop_server
    from trio_websocket import open_websocket_url

    from omnigent.agents import bundle_bytes

    with tempfile.TemporaryDirectory(prefix="bench-watchers-") as tmp:
        env = {**os.environ, "HOME": tmp, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": "unused"}
        proc, url = start_server(env, Path(tmp) / "data", runners=0)
        try:
            limits = httpx.Limits(max_connections=watchers + 4, max_keepalive_connections=watchers + 4)
            async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as http:
                bundle = bundle_bytes(REPO / "examples" / "hello.yaml")
                r = await http.post("/v1/sessions", data={"metadata": "{}"},
                                    files={"bundle": ("agent.tar.gz", bundle, "application/gzip")})
                r.raise_for_status()
                sid = r.json()["session_id"]
                greeted = trio.Semaphore(0, max_value=max(1, watchers))

                async def sse() -> None:
                    async with http.stream("GET", f"/v1/sessions/{sid}/stream") as resp:
                        async for line in resp.aiter_lines():
                            if line.startswith("data: {"):
                                greeted.release()
                                await trio.sleep_forever()

                async def ws() -> None:
                    async with open_websocket_url(f"ws{url[4:]}/v1/sessions/{sid}/ws",
                                                  extra_headers=[("Origin", "omnigent://internal")]) as conn:
                        await conn.get_message()
                        greeted.release()
                        await trio.sleep_forever()

                for _ in range(2):  # warm the routes: first-use imports are not per watcher
                    async with trio.open_nursery() as warm:
                        warm.start_soon(sse if kind == "sse" else ws)
                        await greeted.acquire()
                        warm.cancel_scope.cancel()
                await trio.sleep(0.5)
                before = pss_kib(proc.pid)
                async with trio.open_nursery() as nursery:
                    for _ in range(watchers):
                        nursery.start_soon(sse if kind == "sse" else ws)
                    for _ in range(watchers):
                        await greeted.acquire()
                    await trio.sleep(0.5)  # let the server settle after the last greeting
                    after = pss_kib(proc.pid)
                    nursery.cancel_scope.cancel()
            return (after - before) / watchers
        finally:
            stop_server(proc)


async def _publish(hub, sid: str, n: int) -> None:
    for i in range(n):
        hub.publish(sid, ev.TEXT_DELTA, turn_id="turn_bench", delta="x" * 8)
        if i % BURST == BURST - 1:
            await trio.sleep(0)
    hub.publish(sid, ev.SESSION_STATUS, status="idle")  # writes the last batch first


async def _round(server, store: Store, n: int, watchers: int) -> float:
    sid = store.create_conversation(agent_id=None)["id"]
    limits = httpx.Limits(max_connections=watchers + 4, max_keepalive_connections=watchers + 4)
    async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=120) as http:
        greeted = trio.Semaphore(0, max_value=max(1, watchers))
        done: list[float] = []
        async with trio.open_nursery() as nursery:
            for _ in range(watchers):
                nursery.start_soon(_watch, http, sid, greeted, done)
            for _ in range(watchers):
                await greeted.acquire()
            start = time.perf_counter()
            await _publish(server.state.hub, sid, n)
            if watchers == 0:
                return time.perf_counter() - start
            while len(done) < watchers:
                await trio.sleep(0.001)
        return max(done) - start


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def main(n: int, counts: list[int], repeats: int, delay_watchers: int, pace: float, delay_s: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "chat.db")
        async with trio.open_nursery() as nursery:
            server = await nursery.start(lambda task_status: run_server(
                store, bind_socket(), token=None, task_status=task_status))
            await _round(server, store, 200, 1)  # warm-up: imports, first connections
            floor = statistics.median([await _round(server, store, n, 0) for _ in range(repeats)])
            print(f"{n} deltas per round, median of {repeats} rounds; floor (no watcher): "
                  f"{floor * 1000:.1f} ms = {n / floor:,.0f} events/s stored")
            print(f"{'watchers':>8}  {'time ms':>9}  {'delivered ev/s':>14}  {'x floor rate':>12}  "
                  f"{'per watcher ms':>14}  {'x floor':>8}")
            for w in counts:
                took = statistics.median([await _round(server, store, n, w) for _ in range(repeats)])
                rate = w * n / took
                per = (took - floor) / w
                print(f"{w:>8}  {took * 1000:>9.1f}  {rate:>14,.0f}  {rate / (n / floor):>12.2f}  "
                      f"{per * 1000:>14.2f}  {per / floor:>8.3f}")
            delays = await _delays(server, store, delay_watchers, pace, delay_s)
            startup_floor = floor_seconds()
            expected = delay_watchers * int(pace * delay_s)
            print(f"\n{delay_watchers} watchers, deltas published at {pace:.0f}/s for {delay_s:.0f} s: "
                  f"{len(delays):,} of {expected:,} deliveries; publish -> delivery p50 "
                  f"{_pct(delays, .5) * 1000:.1f} ms, p99 {_pct(delays, .99) * 1000:.1f} ms, "
                  f"max {max(delays) * 1000:.1f} ms = {_pct(delays, .5) / startup_floor:.3f} / "
                  f"{_pct(delays, .99) / startup_floor:.3f} / {max(delays) / startup_floor:.3f}x the floor "
                  f"`python -c 'import openai, trio'` ({startup_floor * 1000:.0f} ms, this run) "
                  f"(the hub batches deltas for up to 20 ms; the watchers are a child process)")
            await server.aclose()
            nursery.cancel_scope.cancel()
        store.close()
    for kind in ("sse", "ws"):
        kib = await _memory_per_watcher(kind, delay_watchers)
        print(f"memory per idle watcher ({kind}, {delay_watchers} on a real `omnigent server`): "
              f"{kib:.0f} KiB of the server's PSS")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--watchers", default="1,10,50,100,200")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--delay-watchers", type=int, default=100)
    parser.add_argument("--rate", type=float, default=500)
    parser.add_argument("--delay-s", type=float, default=3)
    args = parser.parse_args()
    trio.run(main, args.events, [int(w) for w in args.watchers.split(",")], args.repeats,
             args.delay_watchers, args.rate, args.delay_s)
