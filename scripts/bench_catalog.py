"""Figures of the session catalog: the 0010 backfill, and a search, on a store of N messages.

    .venv/bin/python scripts/bench_catalog.py [--messages 10000] [--runs 3]

A store at the schema before 0010 is built with raw SQL (N messages over N/100
conversations, string and part content as the releases wrote), then, alternating
per run: the upgrade (opening it: 0010 creates the index and backfills it), the
floor (opening the upgraded copy again: no migration), and a search in each mode.
Prints medians; the machine's load is printed too (figures are noisy under load).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omnigent.store import MIGRATIONS, Store
from omnigent.store import search as store_search


def build(path: Path, messages: int) -> None:
    conn = sqlite3.connect(path)
    conversations = max(1, messages // 100)
    per_conv = messages // conversations
    with conn:
        conn.executescript("""CREATE TABLE migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL);
                              CREATE TABLE additive_migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL);""")
        for migration in MIGRATIONS[:-1]:
            conn.executescript(migration.sql)
            table = "additive_migrations" if migration.additive else "migrations"
            conn.execute(f"INSERT INTO {table} VALUES (?, 1.0)", [migration.name])
        conn.execute("INSERT INTO agents (id, name, spec, created_at, updated_at) VALUES ('ag_1', 'a', '{}', 1, 1)")
        rows = []
        for c in range(conversations):
            cid = f"conv_{c:032x}"
            conn.execute("INSERT INTO conversations (id, created_at, updated_at, agent_id, next_position) "
                         "VALUES (?, ?, ?, 'ag_1', ?)", [cid, c, c, per_conv])
            for p in range(per_conv):
                role = ("user", "assistant")[p % 2]
                words = " ".join(f"word{(c * 7 + p * 13 + k) % 5000}" for k in range(40))  # ~300 chars
                content = (f'"{words}"' if role == "user" else
                           f'[{{"type": "output_text", "text": "{words}", "annotations": []}}]')
                rows.append((f"msg_{c}_{p}", cid, p, role, f'{{"role": "{role}", "content": {content}}}'))
        conn.executemany("INSERT INTO conversation_items (id, conversation_id, position, type, role, data, created_at)"
                         " VALUES (?, ?, ?, 'message', ?, ?, 1.0)", rows)
    conn.close()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.db"
        build(base, args.messages)
        upgrade, floor, fts, like = [], [], [], []
        for run in range(args.runs):
            path = Path(tmp) / f"run{run}.db"
            shutil.copy(base, path)
            upgrade.append(timed(lambda p=path: Store(p).close()))
            floor.append(timed(lambda p=path: Store(p).close()))
            with Store(path) as store:
                fts.append(timed(lambda: store.search_conversations("word42 word43")))
                store._search_mode = store_search.MODE_LIKE
                like.append(timed(lambda: store.search_conversations("word42 word43")))
    med = statistics.median
    print(f"load: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores; {args.messages} messages, "
          f"{args.runs} runs, medians")
    print(f"open with the 0010 backfill: {med(upgrade) * 1000:.0f} ms; open after it (floor): "
          f"{med(floor) * 1000:.0f} ms; backfill ≈ {(med(upgrade) - med(floor)) * 1000:.0f} ms")
    print(f"search 'word42 word43', 20 rows: fts5 {med(fts) * 1000:.1f} ms, like {med(like) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
