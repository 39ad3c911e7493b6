"""Benchmark: what a tool step costs end to end, from the model's call to its stored result.

One `omnigent run -p --permission-mode auto` per round against the mock LLM,
scripted with --calls tool calls (one per model step) and a final answer. The
figure per call is the time from the call's `session.tool.started` event
(stored when the loop dispatches the ToolStart) to its
`session.tool.completed` event (stored with the `function_call_output`, in
one transaction), read from the session's stored event log afterwards. It
includes the frame to the runner, the tool itself, the result frame and the
commit. Done for a trivial `shell` (`true`) and a `read_file` of a small file.

Prints the median and p90 per tool, and the median as a ratio to the floor
`python -c "import openai, trio"`, timed in the same run (once per round).

Usage: python scripts/bench_tool_steps.py [--rounds 5] [--calls 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_run import import_floor, start_mock  # noqa: E402

AGENT = """name: bench-tools
prompt: You run tools.
executor:
  model: bench-tools
tools: [shell, read_file]
"""
CALLS = {
    "shell": {"command": "true"},
    "read_file": {"path": "small.txt"},
}


def one_round(url: str, env: dict[str, str], tool: str, calls: int) -> list[float]:
    work = Path(tempfile.mkdtemp(prefix="omnigent-bench-tools-"))
    try:
        (work / "agent.yaml").write_text(AGENT)
        (work / "small.txt").write_text("".join(f"line {i}\n" for i in range(50)))
        script = [{"tool_calls": [{"name": tool, "arguments": json.dumps(CALLS[tool])}]} for _ in range(calls)]
        script.append({"text": "done"})
        httpx.post(f"{url}/mock/configure", json={"key": "bench-tools", "responses": script}).raise_for_status()
        run_env = {**env, "HOME": str(work / "home"), "OMNIGENT_DATA_DIR": str(work / "data")}
        proc = subprocess.run(
            [sys.executable, "-m", "omnigent", "run", "agent.yaml", "-p", "go", "--permission-mode", "auto",
             "--output-format", "json"],
            cwd=work, env=run_env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise SystemExit(f"run failed ({proc.returncode}): {proc.stderr.strip()}")
        db = sqlite3.connect(work / "data" / "chat.db")
        started: dict[str, float] = {}
        spans: list[float] = []
        for type_, data, created in db.execute(
                "SELECT type, data, created_at FROM session_events ORDER BY conversation_id, seq"):
            if type_ not in ("session.tool.started", "session.tool.completed"):
                continue
            call_id = json.loads(data)["call_id"]
            if type_ == "session.tool.started":
                started[call_id] = created
            elif call_id in started:
                spans.append(created - started.pop(call_id))
        db.close()
        if len(spans) != calls:
            raise SystemExit(f"{tool}: {len(spans)} of {calls} tool steps were stored")
        return spans
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    mock, url = start_mock()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIGENT_")}
    env.update(OPENAI_BASE_URL=f"{url}/v1", OPENAI_API_KEY="sk-bench")
    try:
        floors: list[float] = []
        spans: dict[str, list[float]] = {tool: [] for tool in CALLS}
        for _ in range(args.rounds):
            floors.append(import_floor(env))
            for tool in CALLS:
                spans[tool].extend(one_round(url, env, tool, args.calls))
        floor = statistics.median(floors)
        print(f"floor (python -c 'import openai, trio'): median {floor * 1000:.0f} ms over {len(floors)} runs")
        print(f"{'tool step (call -> result stored)':<36} {'median':>9} {'p90':>9} {'ratio to floor':>15}")
        for tool, values in spans.items():
            values.sort()
            median = statistics.median(values)
            p90 = values[int(0.9 * (len(values) - 1))]
            print(f"{tool:<36} {median * 1000:>7.1f} ms {p90 * 1000:>7.1f} ms {median / floor:>15.3f}")
    finally:
        mock.terminate()
        mock.wait()


if __name__ == "__main__":
    main()
