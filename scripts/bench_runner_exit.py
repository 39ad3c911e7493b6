"""Benchmark: how fast a runner exits once its parent dies (stdin EOF), in every state.

States: "start" (EOF right at spawn, before the interpreter reaches trio),
"importing" (EOF as soon as the runner logged its start: openai is importing),
"connecting" (no server listening: the runner retries), "idle" (online, no
turn) and "mid-turn" (a model call parked in the mock LLM). For each: the time
from closing the runner's stdin to its exit, median and max over --runs, with
--load N busy processes spinning meanwhile (a loaded 2-core machine).

Usage: python scripts/bench_runner_exit.py [--runs 5] [--load 4]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import httpx
import trio
from trio_websocket import serve_websocket

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from omnigent.testing import mock_llm  # noqa: E402
from protocol import MAX_FRAME_BYTES, PROTOCOL_VERSION, HelloAck, TurnStart, encode  # noqa: E402

STATES = ("start", "importing", "connecting", "idle", "mid-turn")
assert PROTOCOL_VERSION


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self) -> None:
        self.send, self.conns = trio.open_memory_channel(10)
        self.port = 0

    async def handler(self, request) -> None:
        ws = await request.accept()
        await self.send.send(ws)
        await trio.sleep_forever()


async def one(state: str, server: Server, llm_url: str, http: httpx.AsyncClient, tmp: Path) -> float:
    url = f"http://127.0.0.1:{free_port() if state == 'connecting' else server.port}"
    log = tmp / f"{uuid.uuid4().hex}.log"
    env = {**os.environ, "OMNIGENT_SERVER_URL": url, "OMNIGENT_RUNNER_ID": f"runner_{uuid.uuid4().hex}",
           "OMNIGENT_RUNNER_TOKEN": "t", "OPENAI_BASE_URL": f"{llm_url}/v1", "OPENAI_API_KEY": "k",
           "PYTHONPATH": str(REPO)}
    with open(log, "wb") as err:
        proc = await trio.lowlevel.open_process([sys.executable, "-m", "omnigent.runner"], stdin=subprocess.PIPE,
                                                stdout=err, stderr=err, env=env, start_new_session=True)
    try:
        if state != "start":
            while "started pid" not in log.read_text():
                await trio.sleep(0.001)
        if state == "connecting":
            while "not reachable" not in log.read_text():
                await trio.sleep(0.01)
        if state in ("idle", "mid-turn"):
            ws = await server.conns.receive()
            await ws.get_message()
            await ws.send_message(encode(HelloAck(ping_interval=1.0)))
            if state == "mid-turn":
                agent = {"name": "t", "instructions": "x", "harness": "openai-agents", "model": "m"}
                await ws.send_message(encode(TurnStart(turn_id=f"turn_{uuid.uuid4().hex[:8]}", session_id="c",
                                                       attempt=1, agent=agent, model="m", input=[
                                                           {"type": "message", "role": "user", "content": "hi"}])))
                while not (await http.get("/gate/pending")).json()["count"]:
                    await trio.sleep(0.01)
        start = trio.current_time()
        await proc.stdin.aclose()
        with trio.fail_after(30):
            await proc.wait()
        return trio.current_time() - start
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


async def main(runs: int, load: int) -> None:
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
    try:
        async with trio.open_nursery() as nursery:
            server = Server()
            listener = await nursery.start(lambda task_status: serve_websocket(
                server.handler, "127.0.0.1", 0, None, max_message_size=MAX_FRAME_BYTES, task_status=task_status))
            server.port = listener.port
            llm_url = await nursery.start(mock_llm.serve)
            async with httpx.AsyncClient(base_url=llm_url, timeout=30) as http:
                await http.post("/mock/configure", json={"key": "default",
                                                         "responses": [{"block": True, "text": "x"}] * 100})
                with tempfile.TemporaryDirectory() as tmp:
                    print(f"runner exit after stdin EOF, {runs} runs per state, {load} busy processes:")
                    for state in STATES:
                        times = [await one(state, server, llm_url, http, Path(tmp)) for _ in range(runs)]
                        print(f"  {state:<11} median {statistics.median(times) * 1000:6.0f} ms"
                              f"   max {max(times) * 1000:6.0f} ms")
            nursery.cancel_scope.cancel()
    finally:
        for b in burners:
            b.kill()
            b.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--load", type=int, default=4)
    args = parser.parse_args()
    trio.run(main, args.runs, args.load)
