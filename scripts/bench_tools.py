"""Benchmark: what the built-in tools cost, and how fast a killed runner's tool tree is gone.

Figures (each a ratio to the floor `python -c "import openai, trio"`, timed in
the same run, alternating with the measured runs, so a shared machine's load
cancels out; medians, absolutes beside them):

  - tool overhead: `run_tool` call -> outcome, in-process, for `shell` running
    `true` (a bash spawn included) and `read_file` of a small file (a worker
    thread round trip included); `bash -c true` spawned plainly, for scale
  - cleanup after a runner SIGKILL mid-tool: tests/support/tool_owner.py plays
    the host (a subreaper that sweeps when its runner exits) and the runner;
    from the SIGKILL of the runner until no process of the tool remains (/proc
    polled every millisecond), for each kind of child a command can leave
    behind (`cmd &`, nohup, setsid, a double fork, a setsid'd daemon, one that
    ignores SIGTERM)

Prints figures; asserts nothing.

Usage: python scripts/bench_tools.py [--runs 7] [--calls 200]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_run import import_floor  # noqa: E402
from omnigent.tools import ToolContext, run_tool, scrub_env  # noqa: E402
from tests.support.tool_owner import kinds, markers_alive  # noqa: E402

OWNER = REPO / "tests" / "support" / "tool_owner.py"
_numbers = itertools.count(int(time.time()) % 10000 * 1000)


async def _overhead(workspace: str, calls: int) -> dict[str, float]:
    """Median seconds per call of each measured thing, over `calls` calls."""
    ctx = ToolContext(workspace, 30.0, scrub_env(os.environ), [])
    things = {
        "shell `true`": ("shell", json.dumps({"command": "true"})),
        "read_file (small)": ("read_file", json.dumps({"path": "small.txt"})),
    }
    out = {}
    for label, (name, args) in things.items():
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            outcome = await run_tool(name, args, ctx)
            times.append(time.perf_counter() - start)
            assert outcome.status == "completed", outcome
        out[label] = statistics.median(times)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        subprocess.run(["bash", "-c", "true"], stdin=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    out["plain `bash -c true` (for scale)"] = statistics.median(times)
    return out


def _read_until(proc: subprocess.Popen, prefix: str, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(prefix):
            return line
    raise RuntimeError(f"tool_owner gave no {prefix!r} line")


def _cleanup_time(workspace: str, kind: str) -> float:
    """Seconds from the runner's SIGKILL until no process of the tool is left."""
    marker = str(next(_numbers))
    command = f"{kinds(marker)[kind]} echo ready; exec sleep 300.{marker}9"
    proc = subprocess.Popen([sys.executable, str(OWNER), "host", workspace, "hang", command],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        runner = int(_read_until(proc, "RUNNER").split()[1])
        _read_until(proc, "READY")
        while len(markers_alive(marker)) < 2:  # the child really started (and the tool's own sleep)
            time.sleep(0.001)
        start = time.perf_counter()
        os.kill(runner, signal.SIGKILL)
        deadline = start + 10
        while markers_alive(marker) and time.perf_counter() < deadline:
            time.sleep(0.001)
        return time.perf_counter() - start
    finally:
        proc.kill()
        proc.wait()
        for pid in markers_alive(marker):
            os.kill(pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory() as workspace:
        Path(workspace, "small.txt").write_text("".join(f"line {i}\n" for i in range(50)))
        floors: list[float] = []
        overheads: dict[str, list[float]] = {}
        cleanup: dict[str, list[float]] = {kind: [] for kind in kinds("0")}
        for run in range(args.runs):
            if run % 2 == 0:
                floors.append(import_floor(env))
            for label, value in trio.run(_overhead, workspace, args.calls).items():
                overheads.setdefault(label, []).append(value)
            for kind in cleanup:
                cleanup[kind].append(_cleanup_time(workspace, kind))
            if run % 2 == 1:
                floors.append(import_floor(env))
        floor = statistics.median(floors)
        print(f"floor `python -c 'import openai, trio'`: median {floor * 1000:.1f} ms over {len(floors)} runs")
        print(f"tool overhead (run_tool call -> outcome, median of {args.runs} medians of {args.calls} calls):")
        for label, values in overheads.items():
            value = statistics.median(values)
            print(f"  {label:34} {value * 1000:7.2f} ms   ratio {value / floor:.4f}")
        print(f"runner SIGKILLed mid-tool -> no process of the tool left (median, max of {args.runs}):")
        for kind, values in cleanup.items():
            value = statistics.median(values)
            print(f"  {kind:34} {value * 1000:7.1f} ms   max {max(values) * 1000:6.1f} ms   "
                  f"ratio {value / floor:.3f}")


if __name__ == "__main__":
    main()
