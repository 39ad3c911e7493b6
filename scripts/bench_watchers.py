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
Asserts nothing. Usage: python scripts/bench_watchers.py [--events 2000] [--watchers 1,10,50,200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

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


async def main(n: int, counts: list[int], repeats: int) -> None:
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
            await server.aclose()
            nursery.cancel_scope.cancel()
        store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--watchers", default="1,10,50,200")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    trio.run(main, args.events, [int(w) for w in args.watchers.split(",")], args.repeats)
