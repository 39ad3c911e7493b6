"""Benchmark: how long a busy runner stays silent to pings on a loaded machine.

The server declares a runner hung when it heard nothing from it for
`ping_interval * ping_allowance` seconds (issue 7 §9: a live runner was killed
under CPU load with the old 3 s). This script plays the server's part, as
`runner_link._ping` does: a ping every second, and at each tick the silence
since the last frame received. Meanwhile the runner serves turns without a
pause (--concurrent at once, each with a history of --history items of about
2 KB and a streamed answer from the mock LLM), while --load processes spin.

Prints the turns served, the silence (median, p99, max) and the pong round
trip (max): the default allowance must sit well above the max.

Usage: python scripts/bench_pings.py [--seconds 40] [--load 4] [--concurrent 3] [--history 300]
       [--pythonpath DIR]   (another checkout's runner, e.g. to compare with a release)
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import trio
from trio_websocket import ConnectionClosed, serve_websocket

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from protocol import MAX_FRAME_BYTES, HelloAck, Ping, Pong, TurnCompleted, TurnFailed, TurnStart, decode, encode  # noqa: E402

ANSWER = " ".join(f"word{i}" for i in range(300))


def start_mock() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "omnigent.testing.mock_llm", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO)
    line = proc.stdout.readline()
    return proc, line.rsplit(" ", 1)[1].strip()


def history(n: int) -> list[dict]:
    filler = "lorem ipsum dolor sit amet " * 70  # ~2 KB
    items = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        kind = "input_text" if role == "user" else "output_text"
        items.append({"type": "message", "role": role, "content": [{"type": kind, "text": f"{i} {filler}"}]})
    if items[-1]["role"] != "user":
        items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]})
    return items


async def main(args: argparse.Namespace) -> None:
    mock, llm_url = start_mock()
    httpx.post(f"{llm_url}/mock/set_fallback", json={"text": ANSWER, "stream": True}).raise_for_status()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    conns: trio.MemorySendChannel
    conns, incoming = trio.open_memory_channel(1)

    async def handler(request) -> None:
        ws = await request.accept()
        await conns.send(ws)
        await trio.sleep_forever()

    silences: list[float] = []
    rtts: list[float] = []
    served = failed = 0
    proc = None
    try:
        async with trio.open_nursery() as nursery:
            listener = await nursery.start(lambda task_status: serve_websocket(
                handler, "127.0.0.1", 0, None, max_message_size=MAX_FRAME_BYTES, task_status=task_status))
            env = {**os.environ, "OMNIGENT_SERVER_URL": f"http://127.0.0.1:{listener.port}",
                   "OMNIGENT_RUNNER_ID": f"runner_{uuid.uuid4().hex}", "OMNIGENT_RUNNER_TOKEN": "t",
                   "OPENAI_BASE_URL": f"{llm_url}/v1", "OPENAI_API_KEY": "k",
                   "PYTHONPATH": args.pythonpath or str(REPO)}
            proc = await trio.lowlevel.open_process([sys.executable, "-m", "omnigent.runner"],
                                                    stdin=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                                    env=env, start_new_session=True)
            ws = await incoming.receive()
            await ws.get_message()
            await ws.send_message(encode(HelloAck(ping_interval=1.0)))
            last_frame = trio.current_time()
            done: dict[str, trio.Event] = {}
            input_items = history(args.history)
            agent = {"name": "t", "instructions": "Answer.", "harness": "openai-agents", "model": "m"}

            async def receive() -> None:
                nonlocal last_frame, served, failed
                try:
                    while True:
                        frame = decode(await ws.get_message())
                        last_frame = trio.current_time()
                        if isinstance(frame, Pong):
                            rtts.append(trio.current_time() - frame.ts)
                        elif isinstance(frame, (TurnCompleted, TurnFailed)):
                            served += isinstance(frame, TurnCompleted)
                            failed += isinstance(frame, TurnFailed)
                            done.pop(frame.turn_id).set()
                except ConnectionClosed:
                    pass

            async def turns() -> None:
                while True:
                    turn_id = f"turn_{uuid.uuid4().hex[:12]}"
                    event = done[turn_id] = trio.Event()
                    await ws.send_message(encode(TurnStart(turn_id=turn_id, session_id=f"conv_{turn_id}",
                                                           attempt=1, agent=agent, model="m", input=input_items)))
                    await event.wait()

            async def pings() -> None:
                while True:
                    await trio.sleep(1.0)
                    silences.append(trio.current_time() - last_frame)
                    await ws.send_message(encode(Ping(ts=trio.current_time())))

            nursery.start_soon(receive)
            for _ in range(args.concurrent):
                nursery.start_soon(turns)
            nursery.start_soon(pings)
            await trio.sleep(args.seconds)
            nursery.cancel_scope.cancel()
    finally:
        for b in burners:
            b.kill()
            b.wait()
        if proc is not None and proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            with trio.CancelScope(shield=True):
                await proc.wait()
        mock.terminate()
        mock.wait()
    silences.sort()
    print(f"{args.seconds:g} s, {args.load} busy processes, {args.concurrent} turns at once, "
          f"history {args.history} items ({len(encode(TurnStart('t', 'c', 1, {}, history(args.history), 'm'))) // 1024} KiB)")
    print(f"  turns completed {served}, failed {failed}")
    print(f"  silence at ping ticks: median {statistics.median(silences):.2f} s"
          f"   p99 {silences[int(len(silences) * 0.99) - 1]:.2f} s   max {silences[-1]:.2f} s")
    print(f"  pong round trip: max {max(rtts) if rtts else float('nan'):.2f} s over {len(rtts)} pongs")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=40)
    parser.add_argument("--load", type=int, default=4)
    parser.add_argument("--concurrent", type=int, default=3)
    parser.add_argument("--history", type=int, default=300)
    parser.add_argument("--pythonpath", default="")
    trio.run(main, parser.parse_args())
