"""A real runner process across a dropped websocket: its turn goes on, its frames wait, it says so.

The fake server of test_runner_process.py closes the runner's connection
while a turn's model call is parked in the mock LLM; the runner dials again
with the same id, reports the turn in its hello (`in_flight`), and once the
model answers, the whole turn (deltas and end) arrives on the new
connection. A 4003 close ends the runner with one line.
"""

from __future__ import annotations

import httpx
import trio

from protocol import Hello, TurnCompleted, TurnEvent

from .test_runner_process import WAIT, configure, llm, make_turn, online, server, spawn  # noqa: F401


async def _gate(http: httpx.AsyncClient) -> None:
    with trio.fail_after(WAIT):
        while not (await http.get("/gate/pending")).json()["count"]:
            await trio.sleep(0.02)


async def test_a_turn_outlives_a_dropped_connection_and_is_reported_in_the_next_hello(spawn, server, llm):
    _, http = llm
    await configure(http, [{"text": "after the drop", "block": True}])
    runner, conn = await online(spawn, server)
    turn = make_turn()
    await conn.send(turn)
    await _gate(http)  # the model call is under way
    await conn.ws.aclose(1001, "server restarting")
    again = await server.accept()
    hello = await again.handshake()
    assert isinstance(hello, Hello)
    assert hello.in_flight == [{"turn_id": turn.turn_id, "attempt": 1, "generation": 0, "step": 0, "kind": "model"}]
    await http.post("/gate/release", json={})
    frames = []
    while not frames or not isinstance(frames[-1], TurnCompleted):
        frame = await again.recv()
        if getattr(frame, "turn_id", None) == turn.turn_id:
            frames.append(frame)
    assert any(isinstance(f, TurnEvent) for f in frames)
    assert frames[-1].output[0]["content"][0]["text"] == "after the drop"
    assert len((await http.get("/mock/requests")).json()["requests"]) == 1  # one model call
    assert runner.proc.returncode is None


async def test_a_4003_close_ends_the_runner_with_one_line(spawn, server):
    runner, conn = await online(spawn, server)
    await conn.ws.aclose(4003, "wrong or missing secret for this runner id")
    assert await runner.wait() == 1
    lines = [line for line in runner.log.read_text().splitlines() if "refused this runner" in line]
    assert len(lines) == 1 and "4003" in lines[0]
