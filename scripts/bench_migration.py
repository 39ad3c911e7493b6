"""Benchmark: how long migrations 0007 + 0008 take on a store of the previous schema.

0008 rebuilds `turns` and `conversation_items` inside the migration's
transaction, which holds the write lock: every other process that opens
the store waits for it, up to the 5 s busy timeout (store/db.py). This
script builds stores of the previous schema (MIGRATIONS[:6], as
tests/unit/test_store_upgrade_steps.py does) with --items items, opens each
with this release's Store (which migrates) and prints the time of the open
(the migration and the pragmas around it) against the busy timeout, plus
the time of opening an already migrated store (the floor).

Usage: python scripts/bench_migration.py [--items 10000 100000] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from omnigent.store import Store  # noqa: E402
from omnigent.store.db import BUSY_TIMEOUT_S  # noqa: E402
from tests.unit.test_store_upgrade_steps import build_previous_store  # noqa: E402


def _open_time(path: Path) -> float:
    start = time.perf_counter()
    Store(path).close()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for items in args.items:
            template = Path(tmp) / f"previous-{items}.db"
            build_previous_store(template, items)
            upgrades, floors = [], []
            for run in range(args.runs):
                path = Path(tmp) / f"run-{items}-{run}.db"
                path.write_bytes(template.read_bytes())
                upgrades.append(_open_time(path))
                floors.append(_open_time(path))
            median = statistics.median(upgrades)
            print(f"{items:>7} items: upgrade open median {median * 1000:.0f} ms (max {max(upgrades) * 1000:.0f} ms), "
                  f"migrated open {statistics.median(floors) * 1000:.0f} ms; "
                  f"{median / BUSY_TIMEOUT_S:.1%} of the {BUSY_TIMEOUT_S:.0f} s busy timeout")


if __name__ == "__main__":
    main()
