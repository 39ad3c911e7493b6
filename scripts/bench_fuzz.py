"""Benchmark: the seeded fuzz against a real server process, with figures.

The server runs in a child process (`run_server` on a real socket, its own
store) together with a task that records the longest gap between its
`trio.sleep(0.005)` wakeups: the longest the event loop was held. This
process sends the fuzz inputs of `tests/fuzz` over the socket (the bulk over
keep-alive HTTP, websockets, then the heavy cases: 40 MiB bodies, 17 MiB
frames, 20,000-member tarballs, hostile YAML) while a well-behaved client
keeps calling the API. Prints, per phase and in total:
  - answers by class and by status code, websocket outcomes by close code;
  - the server's longest event-loop stall;
  - the well-behaved client's median, p99 and worst latency;
  - the store's integrity check afterwards.
Prints figures; asserts nothing.

Usage: python scripts/bench_fuzz.py [--count 10000] [--seed 20261201] [--no-heavy]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import trio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fuzz.driver import (  # noqa: E402
    Tally, check_http, final_checks, make_targets, raw_request, run_ws, steady_client)
from tests.fuzz.inputs import HttpCase, Route, case, heavy_cases  # noqa: E402

TOKEN = "bench-fuzz-token"


# --- the server child -------------------------------------------------------------


async def _serve(db: str) -> None:
    from omnigent.server.app import create_app
    from omnigent.server.serve import run_server
    from omnigent.server.sockets import bind_socket
    from omnigent.store import Store

    worst = [0.0]

    async def monitor() -> None:
        last = trio.current_time()
        while True:
            await trio.sleep(0.005)
            now = trio.current_time()
            worst[0] = max(worst[0], now - last)
            last = now

    store = Store(db)
    async with trio.open_nursery() as nursery:
        server = await nursery.start(lambda task_status: run_server(
            store, bind_socket(), token=TOKEN, runner_wait=0.3, ping_interval=0.2, task_status=task_status))
        rules = [{"rule": r.rule, "methods": sorted(r.methods or ()), "websocket": bool(r.websocket)}
                 for r in create_app(server.state).url_map.iter_rules()]
        nursery.start_soon(monitor)
        print(json.dumps({"url": server.url, "routes": rules}), flush=True)
        stdin = trio.lowlevel.FdStream(0)
        while chunk := await stdin.receive_some():  # each line: the worst stall since the last one
            for _line in range(chunk.count(b"\n")):
                print(json.dumps({"max_stall": worst[0]}), flush=True)
                worst[0] = 0.0
        await server.aclose()
        nursery.cancel_scope.cancel()
    store.close()


# --- the fuzzing side ---------------------------------------------------------------


class Server:
    def __init__(self, db: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", str(db)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=REPO)
        hello = json.loads(self.proc.stdout.readline())
        self.url = hello["url"]
        self.routes = [Route(r["rule"], frozenset(r["methods"]), r["websocket"]) for r in hello["routes"]]

    async def max_stall(self) -> float:
        def ask() -> float:
            self.proc.stdin.write("?\n")
            self.proc.stdin.flush()
            return json.loads(self.proc.stdout.readline())["max_stall"]
        return await trio.to_thread.run_sync(ask)

    def stop(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def _bulk(server: Server, seed: int, count: int, targets, tally: Tally) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        for index in range(count):
            one = case(seed, index, server.routes, targets)
            where = f"seed {seed} index {index} ({one.label})"
            if not isinstance(one, HttpCase):
                await run_ws(server.url, one, tally, where)
                continue
            try:
                resp = await http.request(one.method, one.path, headers=list(one.headers), content=one.body)
            except (httpx.LocalProtocolError, httpx.InvalidURL, ValueError, UnicodeError):
                tally.other["unsendable by httpx"] += 1
                continue
            except httpx.TransportError:
                tally.other["connection cut"] += 1  # an early 413 while we still sent, say
                continue
            check_http(tally, where, resp.status_code, resp.content, one.method)


async def _heavy(server: Server, targets, tally: Tally) -> None:
    url = urlsplit(server.url)
    for index, one in enumerate(heavy_cases(targets)):
        where = f"heavy case {index} ({one.label})"
        started = time.monotonic()
        before = len(tally.failures)
        if isinstance(one, HttpCase):
            await raw_request(url.hostname, url.port, one, tally, where)
        else:
            await run_ws(server.url, one, tally, where)
        stall = await server.max_stall()
        verdict = "ok" if len(tally.failures) == before else tally.failures[-1]
        print(f"  {one.label:<28} {time.monotonic() - started:6.2f} s, loop stall {stall * 1000:6.0f} ms: {verdict}")


def _print(phase: str, tally: Tally, stall: float, seconds: float) -> None:
    codes = ", ".join(f"{code}: {n}" for code, n in sorted(tally.http.items(), key=lambda kv: str(kv[0])))
    print(f"{phase}: {tally.inputs} inputs in {seconds:.1f} s")
    print(f"  HTTP by class: {tally.by_class()}")
    print(f"  HTTP by code:  {codes}")
    print(f"  websockets:    {dict(sorted(tally.ws.items()))}")
    if tally.other:
        print(f"  other:         {dict(tally.other)}")
    if tally.steady:
        lat = sorted(tally.steady)
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        print(f"  well-behaved client: {len(lat)} calls, median {statistics.median(lat) * 1000:.1f} ms, "
              f"p99 {p99 * 1000:.1f} ms, worst {lat[-1] * 1000:.1f} ms")
    print(f"  server's longest event-loop stall: {stall * 1000:.0f} ms")
    print(f"  failed checks: {len(tally.failures)}")
    for line in tally.failures[:15]:
        print(f"    {line}")


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "chat.db"
        server = Server(db)
        try:
            targets = await make_targets(server.url, TOKEN)
            for phase in ("bulk", "heavy"):
                if phase == "heavy" and args.no_heavy:
                    continue
                tally = Tally()
                stop = trio.Event()
                await server.max_stall()  # reset
                started = time.monotonic()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(steady_client, server.url, targets, tally, stop)
                    if phase == "bulk":
                        await _bulk(server, args.seed, args.count, targets, tally)
                    else:
                        await _heavy(server, targets, tally)
                    stop.set()
                stall = await server.max_stall()
                if phase == "heavy":
                    await final_checks(server.url, db, tally)
                _print(phase, tally, stall, time.monotonic() - started)
        finally:
            server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--no-heavy", action="store_true")
    parser.add_argument("--serve", metavar="DB", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        trio.run(_serve, args.serve)
    else:
        trio.run(main, args)
