"""Benchmark: restart the server -> every runner online again.

Starts `omnigent server --runners 0` on a data dir and N explicit runners
(`omnigent.cli._start_cli_runner_process`: they are not the server's
children, so they outlive it), then, per round, SIGKILLs the server, starts
it again on the same port and store, and times with the real clock:
  - kill -> every runner online again (what a user of the server waits);
  - the new server listening -> every runner online again (the runners' share:
    their redial backoff, hello, credential check);
each also as a ratio to `python -c "import openai, trio"` timed in the same
run (the floor of any omnigent process start). Prints figures; asserts nothing.

Usage: python scripts/bench_restart.py [--runners 4] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from omnigent.cli import _start_cli_runner_process, _stop_cli_runner_process  # noqa: E402

from bench_run import import_floor  # noqa: E402


def serve(env: dict[str, str], data: Path, port: int) -> tuple[subprocess.Popen[str], str, float]:
    proc = subprocess.Popen([sys.executable, "-m", "omnigent", "server", "--runners", "0", "--port", str(port),
                             "--data-dir", str(data)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if "listening on " not in line:
        proc.kill()
        raise SystemExit(f"server did not start: {line!r}")
    return proc, line.split("listening on ")[1].split()[0], time.perf_counter()


def all_online(url: str, ids: list[str]) -> bool:
    try:
        return all(httpx.get(f"{url}/v1/runners/{rid}/status", timeout=2).json()["online"] for rid in ids)
    except httpx.TransportError:
        return False


def wait_online(url: str, ids: list[str], timeout: float = 60) -> float:
    deadline = time.perf_counter() + timeout
    while not all_online(url, ids):
        if time.perf_counter() > deadline:
            raise SystemExit("runners did not come back online")
        time.sleep(0.01)
    return time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runners", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        env = {**os.environ, "HOME": str(home), "OPENAI_API_KEY": "unused", "PYTHONPATH": str(REPO)}
        os.environ["HOME"] = str(home)  # the runners' logs and the registration's client side
        server, url, _ = serve(env, Path(tmp) / "data", 0)
        port = int(url.rsplit(":", 1)[1])
        runners = [_start_cli_runner_process(server_url=url, workspace_cwd=tmp, capture_logs=True,
                                             log_dir=Path(tmp) / "logs", prewarm_spec_path=None) for _ in range(args.runners)]
        ids = [r.runner_id for r in runners]
        totals, shares, floors = [], [], []
        try:
            wait_online(url, ids)
            for _ in range(args.rounds):
                floors.append(import_floor(env))
                killed = time.perf_counter()
                server.send_signal(signal.SIGKILL)
                server.wait()
                server, _, listening = serve(env, Path(tmp) / "data", port)
                back = wait_online(url, ids)
                totals.append(back - killed)
                shares.append(back - listening)
        finally:
            for runner in runners:
                _stop_cli_runner_process(runner.proc, grace_timeout=2.0)
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=15)
    floor = statistics.median(floors)
    total, share = statistics.median(totals), statistics.median(shares)
    print(f"restart the server -> all {args.runners} runners online again, {args.rounds} rounds")
    print(f"  kill -> all online:           median {total:.3f} s (min {min(totals):.3f}, max {max(totals):.3f})"
          f" = {total / floor:.2f} x the import floor")
    print(f"  server listening -> all online: median {share:.3f} s (min {min(shares):.3f}, max {max(shares):.3f})"
          f" = {share / floor:.2f} x the import floor")
    print(f"  `python -c 'import openai, trio'` in the same run: median {floor:.3f} s")


if __name__ == "__main__":
    main()
