"""What a runner's idle keep-alive connections cost each model request (issue 10).

Why: a runner reaches the model through one openai client per endpoint, with
openai's connection limits (100 kept alive for 5 s). After a burst of concurrent
calls its pool holds that many idle connections, and httpcore sweeps the whole
pool at every request and every release, polling each idle connection
(`select.poll`). This shows what that sweep costs a request, so the choice of
keeping openai's limits (ARCHITECTURE, "Model calls") can be checked, and why
`bench_sessions.py` warms its sessions a few at a time.

Timed: the runner's own HTTP client (`openai.DefaultAsyncHttpxClient`, trio)
posting a small JSON body to a local HTTP server in the same process that
answers at once, one request after the other, with 0 and with `--idle` idle
connections left in its pool by a burst; the median round trip, in µs and as a
ratio to the floor (`python -c "import openai, trio"`) timed in the same run,
and the difference per idle connection. Prints figures; asserts nothing.

    python scripts/bench_pool_sweep.py [--idle 30] [--requests 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from bench_run import floor_seconds  # noqa: E402

_ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def _serve(stream, slow) -> None:
    """A keep-alive HTTP/1.1 server: each request answered once its head and body are in
    (after `slow[0]` s: the burst holds its connections open together)."""
    import trio

    buffered = b""
    try:
        while data := await stream.receive_some(65536):
            buffered += data
            while b"\r\n\r\n" in buffered:
                head, _, rest = buffered.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                if len(rest) < length:
                    break
                buffered = rest[length:]
                await trio.sleep(slow[0])
                await stream.send_all(_ANSWER)
    except trio.BrokenResourceError:
        pass


async def _round_trips(idle: int, requests: int) -> float:
    """The median round trip of `requests` requests one after the other, `idle` connections idle."""
    import openai
    import trio

    slow = [0.05]
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, partial(_serve, slow=slow), 0, host="127.0.0.1"))
        url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}/v1/responses"
        async with openai.DefaultAsyncHttpxClient() as client:
            async with trio.open_nursery() as burst:  # idle + 1 connections open at once
                for _ in range(idle + 1):
                    burst.start_soon(client.post, url)
            slow[0] = 0.0
            times = []
            for _ in range(requests):
                began = time.perf_counter()
                await client.post(url, json={"model": "m", "input": "hi"})
                times.append(time.perf_counter() - began)
        nursery.cancel_scope.cancel()
    return statistics.median(times[len(times) // 10:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=int, default=30, help="idle connections a burst leaves in the pool")
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    import trio

    floor = floor_seconds(3)
    quiet = trio.run(_round_trips, 0, args.requests)
    busy = trio.run(_round_trips, args.idle, args.requests)
    floor = (floor + floor_seconds(3)) / 2  # before and after, as the other scripts do
    print(f"floor (python -c 'import openai, trio'): {floor * 1000:.0f} ms")
    print("idle connections in the pool | a request's round trip | x floor")
    for idle, seconds in ((0, quiet), (args.idle, busy)):
        print(f"{idle:>28} | {seconds * 1e6:>13.0f} µs | {seconds / floor:.1e}")
    per = (busy - quiet) / max(1, args.idle)
    print(f"each idle connection: +{per * 1e6:.1f} µs a request ({per / floor:.1e}× the floor): "
          "swept at the request and at its release")


if __name__ == "__main__":
    main()
