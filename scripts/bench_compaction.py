"""What a turn's end spends looking for deltas to compact, by session length (issue 10).

Why: every turn's end looks for ended turns pushed out of the delta window
(`EventsMixin._compact_recent_locked`), inside the end transaction, which is on
the path from the model's answer to `response.completed`. Its cost was reading
the window's rows; this script shows what the look costs on a real store file,
for sessions shorter and longer than the window, so a change to it can be
compared run against run (`bench_ab.py REV -- bench_compaction.py`).

Timed: one look inside its own `BEGIN IMMEDIATE` ... `COMMIT` (nothing to
drop: every turn's deltas are gone already), the best of `--rounds` rounds of
`--looks` looks, in µs and as a ratio to the floor
(`python -c "import openai, trio"`) timed in the same run.
Prints figures; asserts nothing.

    python scripts/bench_compaction.py [--turns 10 100 1000] [--looks 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_run import floor_seconds  # noqa: E402

from omnigent.store import Store  # noqa: E402
from omnigent.store.db import write_transaction  # noqa: E402

KEEP = 50  # the hub's delta window (`EventHub.delta_turns`'s default)


def session_of(store: Store, turns: int) -> tuple[str, str]:
    """A session of `turns` ended turns; its id and its newest turn's."""
    sid = store.create_conversation(agent_id=None)["id"]
    last = ""
    for _ in range(turns):
        _item, turn = store.queue_message(sid, {"type": "message", "role": "user", "content": "q"})
        store.start_turn(turn["id"], "runner_bench")
        store.finish_turn(turn["id"], "completed")
        last = turn["id"]
    return sid, last


def look_seconds(store: Store, sid: str, ending: str, looks: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(looks):
            with write_transaction(store.conn):
                store._compact_recent_locked(sid, KEEP, {ending})
        best = min(best, (time.perf_counter() - started) / looks)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--looks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    floor = floor_seconds(3)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(str(Path(tmp) / "chat.db"))
        rows = [(n, look_seconds(store, *session_of(store, n), args.looks, args.rounds)) for n in args.turns]
        store.close()
    floor = (floor + floor_seconds(3)) / 2  # before and after, as the other scripts do
    print(f"floor (python -c 'import openai, trio'): {floor * 1000:.0f} ms; the delta window: {KEEP} turns")
    print("turns in the session | one look, with its BEGIN/COMMIT | x floor")
    for n, seconds in rows:
        print(f"{n:>20} | {seconds * 1e6:>8.1f} µs | {seconds / floor:.1e}")


if __name__ == "__main__":
    main()
