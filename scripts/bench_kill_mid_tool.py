"""Benchmark: SIGKILL of the runner while a side-effecting tool runs, and how the turn goes on.

Each round runs `omnigent run agent.yaml -p go --permission-mode auto` against
the mock LLM scripted to call `shell` with `sleep 30; echo once >> f`, then
answer. Once the `sleep` runs, the runner is SIGKILLed. Two figures per
round, from the kill:
- until no process of the killed runner's tool is left (`sleep`, `bash`);
- until `omnigent run` has printed the answer and exited (the call stored
  as interrupted, a replacement runner online, the next model step answered).

Prints medians and maxima, and each median as a ratio to the floor
`python -c "import openai, trio"`, timed in the same run (once per round).

Usage: python scripts/bench_kill_mid_tool.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_run import alive, import_floor, start_mock, tagged_pids  # noqa: E402

AGENT = "name: killer\nprompt: Be brief.\nexecutor:\n  model: bench-kill\ntools: [shell]\n"


def _tagged(tag: str) -> list[tuple[int, str]]:
    """(pid, command line) of the live processes carrying `tag` in their environment."""
    found = []
    for pid in tagged_pids(tag):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if alive(pid):
                    found.append((pid, f.read().replace(b"\0", b" ").decode(errors="replace")))
        except OSError:
            continue
    return found


def _until(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.002)


def one_round(url: str, env: dict[str, str]) -> tuple[float, float]:
    work = Path(tempfile.mkdtemp(prefix="omnigent-bench-kill-"))
    try:
        (work / "agent.yaml").write_text(AGENT)
        script = [{"tool_calls": [{"name": "shell", "arguments": json.dumps({"command": "sleep 30; echo once >> f"})}]},
                  {"text": "done"}]
        httpx.post(f"{url}/mock/configure", json={"key": "bench-kill", "responses": script}).raise_for_status()
        tag = uuid.uuid4().hex
        run_env = {**env, "HOME": str(work / "home"), "OMNIGENT_BENCH_TAG": tag}
        proc = subprocess.Popen([sys.executable, "-m", "omnigent", "run", "agent.yaml", "-p", "go",
                                 "--permission-mode", "auto"], cwd=work, env=run_env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _until(lambda: any(cmd.startswith("sleep") for _, cmd in _tagged(tag)), 60)
            (runner,) = [pid for pid, cmd in _tagged(tag) if "omnigent.runner" in cmd]
            os.kill(runner, signal.SIGKILL)
            killed = time.monotonic()
            _until(lambda: not any(cmd.startswith(("sleep", "bash", "unshare")) for _, cmd in _tagged(tag)), 10)
            clean = time.monotonic() - killed
            out, err = proc.communicate(timeout=60)
            answered = time.monotonic() - killed
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if proc.returncode != 0 or "done" not in out or (work / "f").exists():
            raise SystemExit(f"round failed ({proc.returncode}): {err.strip()}")
        return clean, answered
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    mock, url = start_mock()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIGENT_")}
    env.update(OPENAI_BASE_URL=f"{url}/v1", OPENAI_API_KEY="sk-bench")
    try:
        floors, cleans, answers = [], [], []
        for _ in range(args.rounds):
            floors.append(import_floor(env))
            clean, answered = one_round(url, env)
            cleans.append(clean)
            answers.append(answered)
        floor = statistics.median(floors)
        print(f"floor (python -c 'import openai, trio'): median {floor * 1000:.0f} ms over {len(floors)} runs")
        for label, values in (("kill -> no process of the tool left", cleans),
                              ("kill -> answer printed, run exited", answers)):
            median = statistics.median(values)
            print(f"{label:<40} median {median * 1000:7.0f} ms  max {max(values) * 1000:7.0f} ms"
                  f"  = {median / floor:.2f}x the floor")
    finally:
        mock.terminate()
        mock.wait()


if __name__ == "__main__":
    main()
