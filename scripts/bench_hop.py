"""What one hop between two processes costs on this machine, busy and after an idle pause (issue 10).

Why: a lone turn crosses four process boundaries more than the floor's call does
(client → server → runner, and back), and `bench_sessions.py --timeline` shows each
crossing at ~0.4–0.9 ms, far more than the CPU the two ends spend on it. This
script times the bare crossing: a parent and a child process bounce a 100-byte
message over loopback TCP, with nothing else in either process, so what is left is
the kernel's and the machine's; then the same with both ends on trio, which adds
its epoll wait, scheduler and socket wrappers. Each round trip is timed twice:
  - back to back: both processes are running, or have only just stopped;
  - after an idle pause (`--gap-ms`, default 50, a model's answer): both have slept,
    and on a virtual machine whose idle vCPUs halt at once (the `haltpoll` cpuidle
    driver with `guest_halt_poll_ns=0`, as on the development machine), each wake-up
    goes through the hypervisor.
Half a round trip is one hop. Printed with the floor (`python -c "import openai,
trio"`) timed in the same run, as every figure of issue 10; prints figures,
asserts nothing.

    python scripts/bench_hop.py                 # 300 round trips each way
    python scripts/bench_hop.py --trips 1000 --gap-ms 20
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_MESSAGE = b"x" * 100

_CHILD = """
import socket, sys
conn = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    data = conn.recv(4096)
    if not data:
        break
    conn.sendall(data)
"""

# the same echo on trio: its epoll wait, scheduler and socket wrappers on the path
_TRIO_CHILD = """
import sys, trio

async def main():
    stream = await trio.open_tcp_stream("127.0.0.1", int(sys.argv[1]))
    async for data in stream:
        await stream.send_all(data)

trio.run(main)
"""


def _floor(runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import openai, trio"], check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def _trio_trips(stream: Any, n: int, gap: float) -> list[float]:  # a trio.SocketStream
    import trio

    out = []
    for _ in range(n):
        if gap:
            await trio.sleep(gap)
        started = time.perf_counter()
        await stream.send_all(_MESSAGE)
        got = 0
        while got < len(_MESSAGE):
            got += len(await stream.receive_some(4096))
        out.append(time.perf_counter() - started)
    return out


def _trio_rounds(n: int, gap: float) -> dict[str, list[float]]:
    """Both ends on trio: the parent's trio.run serves the child's connection."""
    import trio

    async def run() -> dict[str, list[float]]:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        child = subprocess.Popen([sys.executable, "-c", _TRIO_CHILD, str(port)], stdin=subprocess.DEVNULL)
        try:
            stream = await listeners[0].accept()
            await _trio_trips(stream, 50, 0)
            rounds: dict[str, list[float]] = {"trio, back to back": [], f"trio, after {gap * 1000:.0f} ms idle": []}
            for _ in range(3):
                rounds["trio, back to back"] += await _trio_trips(stream, n // 3, 0)
                rounds[f"trio, after {gap * 1000:.0f} ms idle"] += await _trio_trips(stream, n // 3, gap)
            await stream.aclose()
        finally:
            await listeners[0].aclose()
            _reap(child)
        return rounds

    return trio.run(run)


def _trips(conn: socket.socket, n: int, gap: float) -> list[float]:
    out = []
    for _ in range(n):
        if gap:
            time.sleep(gap)
        started = time.perf_counter()
        conn.sendall(_MESSAGE)
        got = 0
        while got < len(_MESSAGE):
            got += len(conn.recv(4096))
        out.append(time.perf_counter() - started)
    return out


def _reap(child: subprocess.Popen[bytes]) -> None:
    """The echo child ends when its connection closes; killed if it has not (a failed run)."""
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _machine() -> str:
    idle = Path("/sys/devices/system/cpu/cpuidle/current_driver")
    poll = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
    driver = idle.read_text().strip() if idle.exists() else "unknown"
    extra = f", guest_halt_poll_ns={poll.read_text().strip()}" if poll.exists() else ""
    return f"{os.cpu_count()} cores, cpuidle driver {driver}{extra}, load average {os.getloadavg()[0]:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trips", type=int, default=300)
    parser.add_argument("--gap-ms", type=float, default=50)
    args = parser.parse_args()
    floor = _floor()
    listener = socket.create_server(("127.0.0.1", 0))
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(listener.getsockname()[1])],
                             stdin=subprocess.DEVNULL)
    try:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _trips(conn, 50, 0)  # warm both ends
        rounds = {"back to back": [], f"after {args.gap_ms:.0f} ms idle": []}
        for _ in range(3):  # alternated, so a drift of the machine lands on both
            rounds["back to back"] += _trips(conn, args.trips // 3, 0)
            rounds[f"after {args.gap_ms:.0f} ms idle"] += _trips(conn, args.trips // 3, args.gap_ms / 1000)
        conn.close()
    finally:
        listener.close()
        _reap(child)
    rounds.update(_trio_rounds(args.trips, args.gap_ms / 1000))
    print(f"machine: {_machine()}")
    print(f"floor (python -c 'import openai, trio'): {floor * 1000:.0f} ms median of 3")
    print()
    print("| one hop (half a round trip over loopback TCP, 100 bytes) | p50 | p99 | p50 as a share of the floor |")
    print("| --- | --- | --- | --- |")
    for name, times in rounds.items():
        p50, p99 = _pct(times, .5) / 2, _pct(times, .99) / 2
        print(f"| {name} ({len(times)} round trips) | {p50 * 1e6:.0f} µs | {p99 * 1e6:.0f} µs | {p50 / floor:.5f}× |")


if __name__ == "__main__":
    main()
