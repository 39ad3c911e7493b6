"""Benchmark: cold `omnigent run -p` against the local mock LLM, as a user runs it.

Prints figures; asserts nothing (targets are checked by reading them):
  - wall time of `omnigent run AGENT -p TEXT` with a fresh HOME each run (median, min, max)
  - peak memory of all its processes together (sum of PSS, sampled), and of the largest one
  - processes left alive after it exits (must be 0)
  - the same wall time as a ratio to `python -c "import openai, trio"` timed in the
    same run, interleaved (the machine's speed and load cancel out of the ratio)

Usage: python scripts/bench_run.py [--runs 10] [--mem-runs 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AGENT = REPO / "examples" / "hello.yaml"


def start_mock() -> tuple[subprocess.Popen, str]:
    _exit_on_sigterm()
    proc = subprocess.Popen([sys.executable, "-m", "omnigent.testing.mock_llm", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    return proc, line.rsplit(" ", 1)[1].strip()


def _exit_on_sigterm() -> None:
    """A SIGTERM (`kill`, `timeout`) ends the script as an exception does, so the `finally` that
    stops its mock runs: Python's default SIGTERM ended the process with the mock left behind."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def tagged_pids(tag: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if tag.encode() in f.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def one_run(env: dict[str, str], *, sample: bool) -> tuple[float, int, int, int, str]:
    home = Path(tempfile.mkdtemp(prefix="omnigent-bench-home-"))
    tag = f"OMNIGENT_BENCH_TAG={uuid.uuid4().hex}"
    run_env = {**env, "HOME": str(home), "OMNIGENT_BENCH_TAG": tag.split("=", 1)[1]}
    argv = [sys.executable, "-m", "omnigent", "run", str(AGENT), "-p", "Say hi"]
    peak_total = peak_one = 0
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=run_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if sample:
        while proc.poll() is None:
            sizes = [pss_kib(pid) for pid in tagged_pids(tag)]
            peak_total = max(peak_total, sum(sizes))
            peak_one = max([peak_one, *sizes])
            time.sleep(0.005)
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}): {err}")
    left = [pid for pid in tagged_pids(tag) if alive(pid)]
    shutil.rmtree(home, ignore_errors=True)
    return wall, peak_total, peak_one, len(left), out.strip()


def import_floor(env: dict[str, str] | None = None) -> float:
    """Wall time of `python -c "import openai, trio"`: what any runner must pay at least."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import openai, trio"], env=env, check=True)
    return time.perf_counter() - start


def floor_seconds(runs: int = 3) -> float:
    """The median of `runs` floors (`import_floor`, this process's environment)."""
    return statistics.median(import_floor() for _ in range(runs))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--mem-runs", type=int, default=3)
    args = parser.parse_args()
    mock, url = start_mock()
    env = {**os.environ, "OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": "mock"}
    try:
        one_run(env, sample=False)  # warm the OS page cache, as any second run would be
        walls, floors, left = [], [], 0
        for _ in range(args.runs):
            wall, _, _, n_left, _ = one_run(env, sample=False)
            walls.append(wall)
            floors.append(import_floor(env))
            left += n_left
        mems = [one_run(env, sample=True) for _ in range(args.mem_runs)]
    finally:
        mock.terminate()
        mock.wait()
    print(f"cold `omnigent run -p` wall time over {args.runs} runs (fresh HOME each):")
    print(f"  median {statistics.median(walls):.3f} s   min {min(walls):.3f} s   max {max(walls):.3f} s")
    floor = statistics.median(floors)
    print(f"`python -c 'import openai, trio'` in the same runs: median {floor:.3f} s;"
          f" ratio run/import {statistics.median(walls) / floor:.2f}")
    print(f"peak memory, all processes together (PSS, sampled every 5 ms, {args.mem_runs} runs):")
    print(f"  max {max(m[1] for m in mems) / 1024:.1f} MiB   largest single process {max(m[2] for m in mems) / 1024:.1f} MiB")
    print(f"processes left alive after exit: {left + sum(m[3] for m in mems)}")


if __name__ == "__main__":
    main()
