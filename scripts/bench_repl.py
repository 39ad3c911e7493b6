"""Benchmark: resuming conversations, as a REPL user does.

Prints figures; asserts nothing:
  - `omnigent run AGENT --continue` with one piped prompt (median wall)
  - the same with 10,000 conversations in the store
  - `/history` of a 1,000-turn conversation: fetching and rendering it (in-process, real server)

Usage: python scripts/bench_repl.py [--runs 7]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from omnigent.agents import bundle_from_spec, load_spec  # noqa: E402
from omnigent.tree.local import run_tree  # noqa: E402
from omnigent.repl.render import Style, transcript  # noqa: E402
from omnigent.store import Store  # noqa: E402

from bench_run import AGENT, start_mock  # noqa: E402


def continue_walls(env: dict[str, str], runs: int) -> list[float]:
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "omnigent", "run", str(AGENT), "--continue"],
                                env=env, input="Say hi again\n", capture_output=True, text=True)
        walls.append(time.perf_counter() - start)
        if result.returncode != 0:
            raise SystemExit(f"--continue failed: {result.stderr}")
    return walls


def fill(db: Path, conversations: int, turns_in_first: int = 0) -> str:
    """Conversations of this agent straight into the store; returns the first one's id."""
    spec = load_spec(AGENT)
    with Store(db) as store:
        agent = store.upsert_agent(spec.name, spec.to_dict(), bundle_from_spec(spec))
        first = None
        for n in range(conversations):
            conv = store.create_conversation(agent_id=agent["id"])
            first = first or conv["id"]
        for n in range(turns_in_first):
            store.append_item(first, {"type": "message", "role": "user",
                                      "content": [{"type": "input_text", "text": f"question {n}"}]})
            store.append_item(first, {"type": "message", "role": "assistant",
                                      "content": [{"type": "output_text", "text": f"answer {n} " * 20}]})
        return first


def history_seconds(db: Path, session_id: str, rounds: int = 5) -> list[float]:
    times: list[float] = []

    async def front(client) -> int:
        for _ in range(rounds):
            start = trio.current_time()
            text = transcript(await client.list_items(session_id), Style(False))
            io.StringIO().write(text)
            times.append(trio.current_time() - start)
        return 0

    trio.run(lambda: run_tree(db, lambda: front))
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    mock, url = start_mock()
    try:
        with tempfile.TemporaryDirectory() as home:
            env = {**os.environ, "HOME": home, "OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": "mock"}
            subprocess.run([sys.executable, "-m", "omnigent", "run", str(AGENT), "-p", "Say hi"],
                           env=env, capture_output=True, check=True)
            small = continue_walls(env, args.runs)
            db = Path(home) / ".omnigent" / "chat.db"
            fill(db, 10_000)
            big = continue_walls(env, args.runs)
        with tempfile.TemporaryDirectory() as home:
            os.environ["HOME"] = home
            db = Path(home) / "chat.db"
            sid = fill(db, 1, turns_in_first=1000)
            hist = history_seconds(db, sid)
    finally:
        mock.terminate()
        mock.wait()
    print(f"`--continue` + one piped prompt, {args.runs} runs: median {statistics.median(small):.3f} s "
          f"(min {min(small):.3f}, max {max(small):.3f})")
    print(f"  same with 10,000 conversations in the store: median {statistics.median(big):.3f} s "
          f"(min {min(big):.3f}, max {max(big):.3f})")
    print(f"`/history` of a 1,000-turn conversation (fetch + render): median {statistics.median(hist):.3f} s "
          f"(max {max(hist):.3f})")


if __name__ == "__main__":
    main()
