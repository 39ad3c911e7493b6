"""Benchmark: session event streams, SSE over httpx (the SDK) against the websocket route.

Against an in-process server (no runner needed: events are published on the
hub directly), it prints
  - time to first event: open a stream and read its greeting heartbeat (median, p90),
    for the SDK's SSE stream and for trio-websocket on `/ws`
  - delivery rate: N events published in a burst, received by one watcher (events/s)
Asserts nothing. Usage: python scripts/bench_sdk_stream.py [--opens 200] [--events 5000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import trio
from trio_websocket import open_websocket_url

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from omnigent.agents import bundle_bytes  # noqa: E402
from omnigent.client import OmnigentClient  # noqa: E402
from omnigent.server.serve import run_server  # noqa: E402
from omnigent.server.sockets import bind_socket  # noqa: E402
from omnigent.store import Store  # noqa: E402


def _ms(samples: list[float]) -> str:
    samples = sorted(samples)
    p90 = samples[int(len(samples) * 0.9) - 1]
    return f"median {statistics.median(samples) * 1000:.2f} ms   p90 {p90 * 1000:.2f} ms"


async def main(opens: int, n_events: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "chat.db")
        async with trio.open_nursery() as nursery:
            handle = await nursery.start(lambda task_status: run_server(
                store, bind_socket(), token="bench", task_status=task_status))
            async with OmnigentClient(handle.url) as client:
                session_id = (await client.create_session(bundle_bytes(REPO / "examples" / "hello.yaml")))["id"]
                ws_url = "ws" + handle.url[4:] + f"/v1/sessions/{session_id}/ws"
                headers = [("Origin", "omnigent://internal")]

                sse, ws = [], []
                for _ in range(opens):
                    start = trio.current_time()
                    async with client.events(session_id):
                        sse.append(trio.current_time() - start)
                    start = trio.current_time()
                    async with open_websocket_url(ws_url, extra_headers=headers) as conn:
                        await conn.get_message()
                        ws.append(trio.current_time() - start)
                print(f"time to first event over {opens} opens (stream open -> greeting heartbeat):")
                print(f"  SSE (SDK, httpx)      {_ms(sse)}")
                print(f"  websocket (trio-ws)   {_ms(ws)}")

                hub = handle.state.hub
                for name in ("SSE (SDK, httpx)", "websocket (trio-ws)"):
                    after = hub.last_seq(session_id)
                    last = after + n_events
                    start = trio.current_time()
                    if name.startswith("SSE"):
                        stream = client.sessions.stream(session_id, after=after)
                        async with stream:
                            for i in range(n_events):
                                hub.publish(session_id, "session.status", status="running")
                            async for event in stream:
                                if event.sequence_number == last:
                                    break
                    else:
                        async with open_websocket_url(f"{ws_url}?after={after}", extra_headers=headers) as conn:
                            for i in range(n_events):
                                hub.publish(session_id, "session.status", status="running")
                            await conn.get_message()  # heartbeat
                            for _ in range(n_events):
                                await conn.get_message()
                    took = trio.current_time() - start
                    print(f"delivery, {n_events} events to one watcher, {name}: {n_events / took:,.0f} events/s")
            await handle.aclose()
            nursery.cancel_scope.cancel()
        store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--opens", type=int, default=200)
    parser.add_argument("--events", type=int, default=5000)
    args = parser.parse_args()
    trio.run(main, args.opens, args.events)
