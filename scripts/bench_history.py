"""What omnigent adds to a turn, at 10, 1,000 and 10,000 conversation items (issue 10, "Flat in length").

One process, real clock, the real pieces of a turn on both sides: the
server's store (SQLite file), event hub (storing every event, its batching
task running, as in a server), turn service and agent loop, the
runner link (`serve_runner`) over an in-memory websocket carrying the
encoded frames, and on the runner side `runner/turns.py` with its history
cache and the real harness (`harness.execute`: the openai client, the
Responses body, the SSE parsing). Only the model is replaced: an
`httpx2.MockTransport` that answers a canned SSE stream, so "the model's own
time" is that handler's, measured and taken out.

For each size the conversation is stored first (alternating user and
assistant messages of ~200 bytes, each pair a turn with its turn row and
the events a turn stores), one turn warms the runner (its history
arrives in full), then `--turns` turns are timed from the message being
posted to `response.completed` reaching a follower (posted as the route
posts: `TurnService.queue_message`). Reported, medians:

- turn: everything omnigent does for a turn but the model's own time;
- request: the runner rebuilding the whole history from its cache (new
  items encoded, the rest kept as bytes), plus from the harness calling
  `create_response` to the model receiving the request (the JSON body
  joined from the cached bytes, the openai client's request), in ms and in
  µs per item;
- rest: turn minus request: what must stay flat, and its difference to the
  10-item figure (goal: within 5 ms);
- SQL/turn: the server's SQL statements per timed turn (its store's trace
  callback; a trigger's statements are its statement's part): a count, so
  unlike the times it does not drift with the machine;
- the same turn with the runner's cache off (`history_cache` not announced:
  every step's history sent in full), and the old server path per step
  (`build_history` over every stored item, plus encoding the full frame).

Figures are printed as ratios to the floor, `python -c "import openai,
trio"`, timed in the same run, and as absolutes. Nothing is asserted.

    python scripts/bench_history.py             # 10, 1000, 10000 items, 15 turns each
    python scripts/bench_history.py --turns 5 --sizes 10 1000
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import openai
import trio
import trio.testing

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import protocol as p  # noqa: E402
from omnigent.link.runner_secrets import hash_secret  # noqa: E402
from omnigent.runner import harness, streams  # noqa: E402
from omnigent.runner.turns import Turns  # noqa: E402
from omnigent.server.history import build_history  # noqa: E402
from omnigent.server.hub import DELTA_TURNS, EventHub  # noqa: E402
from omnigent.server.registry import RunnerRegistry  # noqa: E402
from omnigent.server.runner_link import serve_runner  # noqa: E402
from omnigent.server.state import ServerState  # noqa: E402
from omnigent.server.turns import TurnService  # noqa: E402
from omnigent.store import Store  # noqa: E402
from omnigent.testing.mock_llm_payloads import response_sse  # noqa: E402
from protocol import events as ev  # noqa: E402

from bench_run import floor_seconds  # noqa: E402  (a sibling script)

MODEL = "bench-history"
SECRET = "s" * 32


class Model:
    """The model: a scripted SSE answer; records when each request arrived and how long it took here."""

    def __init__(self) -> None:
        self.arrived: list[float] = []
        self.own: list[float] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        started = time.perf_counter()
        self.arrived.append(started)
        sse = response_sse({"text": "ok", "stream": True}, MODEL).encode()  # new item ids every time
        response = httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=sse)
        self.own.append(time.perf_counter() - started)
        return response


class MemoryTransport:
    """The server's side of the runner websocket: text frames over memory channels."""

    def __init__(self, send: trio.MemorySendChannel[str], receive: trio.MemoryReceiveChannel[str]) -> None:
        self._send, self._receive = send, receive

    async def receive(self) -> str:
        try:
            return await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise ConnectionError("gone") from None

    async def send(self, text: str) -> None:
        self._send.send_nowait(text)
        await trio.lowlevel.checkpoint()

    async def close(self, code: int, reason: str) -> None:
        self._send.close()


async def run_runner(turns: Turns, to_server: trio.MemorySendChannel[str],
                     from_server: trio.MemoryReceiveChannel[str], runner_id: str) -> None:
    """What runner/main.py does with one connection, minus the socket: hello, frames both ways."""
    to_server.send_nowait(p.encode(p.Hello(runner_id, os.getpid(), p.PROTOCOL_VERSION, ["openai-agents"],
                                           features=list(turns.features))))
    assert isinstance(p.decode(await from_server.receive()), p.HelloAck)
    async with trio.open_nursery() as nursery:
        turns.nursery = nursery

        async def send_loop() -> None:
            while True:
                frame, turn = await turns.queued.receive()
                to_server.send_nowait(p.encode(frame))
                turns.sent(frame, turn)

        nursery.start_soon(send_loop)
        async for raw in from_server:
            frame = p.decode(raw)
            if isinstance(frame, p.Ping):
                to_server.send_nowait(p.encode(p.Pong(frame.ts)))
            elif isinstance(frame, (p.TurnStart, p.ToolStart)):
                turns.start(frame)
            elif isinstance(frame, p.Cancel):
                turns.cancel(frame.turn_id)


def fill(store: Store, conv: str, count: int) -> None:
    """`count` items as real turns leave them: each question and answer a turn of its own, with its
    turn row and the events a turn stores (deltas compacted past the newest DELTA_TURNS, as the
    hub's compaction leaves them), so that per-turn statements meet a long session's tables."""
    filler = "lorem ipsum dolor sit amet " * 6
    with store.event_transaction():
        for n in range(0, count, 2):
            question = store.append_item(conv, {"type": "message", "role": "user",
                                                "content": [{"type": "input_text", "text": f"question {n} {filler}"}]})
            if n + 1 >= count:
                break
            turn = store.create_turn(conv, question["id"])
            store.start_turn(turn["id"], "runner_fill")
            store.append_item(conv, {"id": f"msg_{n + 1:08d}", "type": "message", "role": "assistant",
                                     "status": "completed",
                                     "content": [{"type": "output_text", "text": f"answer {n + 1} {filler}",
                                                  "annotations": []}]}, turn_id=turn["id"])
            store.finish_turn(turn["id"], "completed")
            kinds = ["session.input.consumed", "session.status", "response.created",
                     *["response.output_text.delta"] * 3, "response.output_item.done", "session.usage",
                     "response.completed", "session.status"]
            store.append_events(conv, [{"type": kind, "turn_id": turn["id"]} for kind in kinds])
    store.compact_events(conv, DELTA_TURNS)


async def measure(size: int, turns_timed: int, cache: bool, tmp: Path,
                  probe: Callable[[Store, bool], None] | None = None) -> dict[str, Any]:
    """One size's timed turns (see the module docstring). `probe`, if given, is called with the
    store as the timed turns begin (True) and once they have ended (False): a profiler's or a
    counter's hook (`bench_turn_writes.py`)."""
    model = Model()
    # the server's SQL statements over the timed turns (a trigger's are its statement's), and of
    # them its write transactions
    statements = [0, 0]

    def count_statement(sql: str) -> None:
        if not sql.startswith("--"):
            statements[0] += 1
            statements[1] += sql.startswith("BEGIN IMMEDIATE")

    requests: list[float] = []  # when the harness began building each request

    real_create = streams.create_response

    async def timed_create(client: Any, kwargs: dict[str, Any]) -> Any:
        requests.append(time.perf_counter())
        return await real_create(client, kwargs)

    streams.create_response = timed_create
    store = Store(tmp / f"chat-{size}-{cache}.db")
    try:
        agent = store.upsert_agent("bench", {"name": "bench", "model": MODEL})
        conv = store.create_conversation(agent_id=agent["id"])["id"]
        fill(store, conv, size)
        environ = {"OPENAI_API_KEY": "x", "OPENAI_BASE_URL": "http://mock/v1"}
        pool = harness.ClientPool(lambda key, url: openai.AsyncOpenAI(
            api_key=key, base_url=url, max_retries=0,
            http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(model))))

        async def execute(start: Any, emit: Any, captured: list[str]) -> Any:
            return await harness.execute(pool, start, emit, environ)

        runner_turns = Turns(execute)
        if not cache:
            runner_turns.features = []
        resolving: list[float] = []  # the runner rebuilding each step's whole history from its cache
        real_full = runner_turns._full_history

        def timed_full(start: Any) -> Any:
            began = time.perf_counter()
            try:
                return real_full(start)
            finally:
                resolving.append(time.perf_counter() - began)

        runner_turns._full_history = timed_full  # type: ignore[method-assign]
        latencies: list[float] = []
        request_times: list[float] = []
        own: list[float] = []
        async with trio.open_nursery() as nursery:
            hub = EventHub(store)  # as the server's: every event stored before it is published
            await nursery.start(hub.run)
            registry = RunnerRegistry()
            service = TurnService(store, hub, registry, nursery)
            state = ServerState(store, hub, registry, service, "t", ping_interval=30.0, ping_allowance=6)
            runner_id = "runner_" + "b" * 32
            store.add_runner_credential(runner_id, hash_secret(SECRET), kind="host")
            to_server, from_runner = trio.open_memory_channel[str](math.inf)
            to_runner, from_server = trio.open_memory_channel[str](math.inf)
            nursery.start_soon(serve_runner, state, runner_id, MemoryTransport(to_runner, from_runner), SECRET)
            nursery.start_soon(run_runner, runner_turns, to_server, from_server, runner_id)
            while runner_id not in registry.online:
                await registry.wait_changed()
            for n in range(1 + turns_timed):
                # as a client's next message comes: after the worker has left the last turn
                await trio.testing.wait_all_tasks_blocked()
                after = store.last_event_seq(conv)
                started = time.perf_counter()
                item, turn = service.queue_message(conv, {  # what `POST /v1/sessions/{id}/events` does
                    "type": "message", "role": "user", "content": [{"type": "input_text", "text": f"timed {n}"}]})
                service.submit(conv)
                async for event in hub.follow(conv, after=after):
                    if event["type"] in p.TERMINAL_EVENTS and event.get("turn_id") == turn["id"]:
                        assert event["type"] == ev.COMPLETED, event
                        break
                ended = time.perf_counter()
                if n == 0:
                    if probe is not None:
                        probe(store, True)
                    store.conn.set_trace_callback(count_statement)
                    continue  # the warm-up: the runner gets the history in full
                latencies.append(ended - started - model.own[-1])
                request_times.append(model.arrived[-1] - requests[-1] + resolving[-1])
                own.append(model.own[-1])
            store.conn.set_trace_callback(None)
            if probe is not None:
                probe(store, False)
            nursery.cancel_scope.cancel()
        await pool.aclose()
        # the old server path per step, for comparison: every item read, built and encoded
        old = []
        last = store.list_items(conv)[-1]["id"]
        for _ in range(5):
            started = time.perf_counter()
            items = build_history(store.list_items(conv), last)
            p.encode(p.TurnStart("turn_x", conv, 1, {"name": "bench"}, items, MODEL))
            old.append(time.perf_counter() - started)
        return {"statements": statements[0] / turns_timed, "writes": statements[1] / turns_timed, "turn": statistics.median(latencies), "request": statistics.median(request_times),
                "model_own": statistics.median(own), "old_server_step": statistics.median(old),
                "items": len(store.list_items(conv))}
    finally:
        streams.create_response = real_create
        store.close()


def quiet_runner() -> None:
    """The runner's log lines would go to this terminal."""
    import omnigent.runner.turns as runner_turns

    runner_turns.log = lambda line: None


def main() -> None:
    quiet_runner()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 1000, 10000])
    parser.add_argument("--turns", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of (cache on, cache off)")
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}; load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
          f"{os.getloadavg()[2]:.2f}", flush=True)
    results: dict[tuple[int, bool], list[dict[str, Any]]] = {}
    floors = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            floors.append(floor_seconds(1))
            where = Path(tmp) / f"round{round_}"
            where.mkdir()
            for size in args.sizes:
                for cache in (True, False):
                    got = trio.run(measure, size, args.turns, cache, where)
                    results.setdefault((size, cache), []).append(got)
    floor = statistics.median(floors)
    print(f"floor (python -c 'import openai, trio'): {floor * 1000:.0f} ms median of {len(floors)}")

    def med(size: int, cache: bool, key: str) -> float:
        return statistics.median(r[key] for r in results[(size, cache)])

    base = med(args.sizes[0], True, "turn") - med(args.sizes[0], True, "request")
    print(f"{'items':>7} | {'turn ms (× floor)':>18} | {'request ms':>10} | {'µs/item':>7} | "
          f"{'rest ms':>8} | {'rest - first':>12} | {'SQL/turn':>8} | {'no cache: turn ms':>17} | "
          f"{'old server step ms':>18}")
    for size in args.sizes:
        turn, request = med(size, True, "turn"), med(size, True, "request")
        rest = turn - request
        items = statistics.median(r["items"] for r in results[(size, True)])
        print(f"{int(items):>7} | {turn * 1000:>8.2f} ({turn / floor:.4f}×) | {request * 1000:>10.2f} | "
              f"{request / items * 1e6:>7.2f} | {rest * 1000:>8.2f} | {(rest - base) * 1000:>+12.2f} | "
              f"{med(size, True, 'statements'):>8.1f} | {med(size, False, 'turn') * 1000:>17.2f} | {med(size, True, 'old_server_step') * 1000:>18.2f}")
    print(f"(model's own time taken out: {med(args.sizes[0], True, 'model_own') * 1e6:.0f} µs median; "
          f"medians of {args.turns} turns × {args.rounds} rounds)")


if __name__ == "__main__":
    main()
