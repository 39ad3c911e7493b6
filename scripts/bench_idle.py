"""Benchmark: what omnigent costs while nobody uses it (issue 10).

A REPL left open in a terminal and a server with its runners waiting for work
still wake for their periodic work: pings to runners, the WAL checkpointer's
look, the search index's batch. On a laptop each wake-up costs more than its
CPU: the core leaves its idle state. This measures both, the real processes
as a user starts them, with the real clock:

  - `omnigent server --runners 4` (a fresh data directory), once every runner is online;
  - `omnigent run examples/hello.yaml` in a pseudo-terminal at its prompt, before any
    turn (the runner, and its warm spare once that has started).

For each process: CPU (ms a second, from /proc: the kernel's 10 ms ticks, so a
long window) and the wake-ups of its main thread (the event loop's: context
switches a second, from /proc/PID/status). The total CPU of a minute of idling
is also given as a ratio to the floor's CPU (`python -c "import openai, trio"`,
timed in the same run). Each measurement starts once the processes have been
quiet for a second (their start-up done). Prints figures; asserts nothing.

    python scripts/bench_idle.py [--seconds 30] [--pythonpath DIR]

`--pythonpath DIR` runs another checkout's omnigent (e.g. the previous commit's, to compare); the
processes run in a temporary directory, so `python -m omnigent` does not find this one's first.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sessions import stop_server, tree_cpu  # noqa: E402  (a sibling script's: its SIGTERM-then-SIGKILL, its /proc reads)

REPO = Path(__file__).resolve().parents[1]


def _switches(pid: int) -> int:
    """Context switches of the main thread (the event loop's): each a wake-up, but for the
    involuntary ones (preempted), few on an idle machine."""
    total = 0
    try:
        with open(f"/proc/{pid}/task/{pid}/status") as f:
            for line in f:
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
    except OSError:
        pass
    return total


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            args = f.read().split("\0")
    except OSError:
        return "?"
    if "omnigent.runner" in args:
        return "runner"
    return "server" if "server" in args else "omnigent run"


def _quiet(root: int, expected: int, timeout: float = 60.0) -> None:
    """Until `root`'s tree has `expected` processes and spent under 20 ms of CPU in a second."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = tree_cpu(root)
        time.sleep(1.0)
        after = tree_cpu(root)
        spent = sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())
        if len(after) >= expected and spent < 0.02:
            return
    raise SystemExit(f"the processes did not settle within {timeout:.0f} s")


def _measure(root: int, seconds: float) -> list[tuple[str, float, float]]:
    cpu0 = tree_cpu(root)
    sw0 = {p: _switches(p) for p in cpu0}
    time.sleep(seconds)
    cpu1 = tree_cpu(root)
    return [(_name(p), (cpu1[p] - cpu0[p]) / seconds * 1000, (_switches(p) - sw0[p]) / seconds)
            for p in cpu0 if p in cpu1]


def _floor_cpu(env: dict[str, str], runs: int = 3) -> float:
    """CPU seconds of `python -c "import openai, trio"` (median of `runs`)."""
    spent = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", "import openai, trio"], env=env, check=True,
                       stdin=subprocess.DEVNULL)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        spent.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return sorted(spent)[len(spent) // 2]


def _server(env: dict[str, str], tmp: Path, seconds: float) -> list[tuple[str, float, float]]:
    proc = subprocess.Popen([sys.executable, "-m", "omnigent", "server", "--runners", "4", "--port", "0",
                             "--data-dir", str(tmp / "data")], env=env, cwd=tmp, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    try:
        if "listening on " not in (proc.stdout.readline() if proc.stdout else ""):
            raise SystemExit("the server did not start")
        _quiet(proc.pid, expected=5)
        return _measure(proc.pid, seconds)
    finally:
        stop_server(proc)


def _repl(env: dict[str, str], seconds: float) -> list[tuple[str, float, float]]:
    import pexpect

    child = pexpect.spawn(sys.executable, ["-m", "omnigent", "run", str(REPO / "examples" / "hello.yaml")],
                          env=env, cwd=env["HOME"], encoding="utf-8", timeout=60)
    try:
        child.expect("❯ ")
        _quiet(child.pid, expected=2)
        return _measure(child.pid, seconds)
    finally:
        child.sendcontrol("d")
        try:
            child.expect(pexpect.EOF, timeout=20)
        finally:
            child.close(force=True)


def _print(title: str, rows: list[tuple[str, float, float]], floor: float) -> None:
    total_cpu = sum(cpu for _, cpu, _ in rows)
    total_wakes = sum(w for _, _, w in rows)
    print(f"{title}: {total_cpu:.2f} ms/s of CPU, {total_wakes:.1f} wake-ups/s in all; "
          f"a minute of it = {total_cpu * 60 / 1000 / floor:.3f}x the floor's CPU")
    for name, cpu, wakes in sorted(rows, key=lambda r: r[0] != "server" and r[0] != "omnigent run"):
        print(f"  {name:13s} {cpu:6.2f} ms/s  {wakes:5.1f} wake-ups/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--pythonpath", help="another checkout's omnigent")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "HOME": tmp, "OPENAI_API_KEY": "sk-idle",
               "OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "PYTHONPATH": args.pythonpath or str(REPO)}
        floor = _floor_cpu(env)
        print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; "
              f"floor (python -c 'import openai, trio'): {floor:.3f} s of CPU; {args.seconds:.0f} s windows")
        _print("idle omnigent server --runners 4", _server(env, Path(tmp), args.seconds), floor)
        _print("idle omnigent run (REPL at its prompt)", _repl(env, args.seconds), floor)


if __name__ == "__main__":
    main()
