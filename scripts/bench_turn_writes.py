"""What a lone turn writes to the store, counted: statements, transactions, WAL pages (issue 10).

Why: on a shared 2-core machine `bench_sessions.py`'s CPU per turn drifts by
15-30 % from run to run, so a change to the store worth 2-5 % of a turn cannot
be seen there. These counts barely move between runs, so they show what a
store change buys (or costs) before it is timed anywhere.

The turns are `bench_history.py`'s: one process, the server's real store,
event hub (with its batching task), turn service and agent loop, the runner's
real turn code and harness, only the model mocked; each message posted as the
route posts it. The WAL checkpoints are held off over the timed turns, so the
WAL file holds every page they wrote; each frame is then put in the b-tree
(table or index) its page belongs to (SQLite's `dbstat`).

Printed per timed turn: the server's SQL statements (a trigger's are its
statement's part), its write transactions (`BEGIN IMMEDIATE`), the commits
and frames in the WAL (a frame is one page written: 4 KiB, plus 24 bytes),
and the frames by b-tree, most first. A commit writes each page it changed
once, so what costs is how many b-trees each transaction touches.
Prints figures; asserts nothing.

    python scripts/bench_turn_writes.py               # 10 items, 20 timed turns
    python scripts/bench_turn_writes.py --items 1000 --turns 10
"""

from __future__ import annotations

import argparse
import collections
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_history  # noqa: E402  (a sibling script: its turns)

from omnigent.server.checkpoints import _Checkpointer  # noqa: E402
from omnigent.store import Store  # noqa: E402

_WAL_HEADER = 32
_FRAME_HEADER = 24


class _WalProbe:
    """`bench_history.measure`'s probe: where the WAL stood as the timed turns began, its bytes once
    they have ended, and which b-tree each page of the file belongs to then."""

    def __init__(self) -> None:
        self.start = 0
        self.wal = b""
        self.owners: dict[int, str] = {}

    def __call__(self, store: Store, begin: bool) -> None:
        wal = Path(f"{store.path}-wal")
        if begin:
            self.start = wal.stat().st_size
            return
        self.wal = wal.read_bytes()
        self.owners = {page: name for name, page in store.conn.execute("SELECT name, pageno FROM dbstat")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10, help="the conversation's length before the timed turns")
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    bench_history.quiet_runner()
    # held off over the whole run: every frame the timed turns write stays in the WAL file
    _Checkpointer.WAL_PAGES = 1 << 40
    probe = _WalProbe()
    with tempfile.TemporaryDirectory() as tmp:
        got: dict[str, Any] = trio.run(bench_history.measure, args.items, args.turns, True, Path(tmp), probe)
    if _salt(probe.wal) is None:
        raise SystemExit("no WAL was written")
    frames, commits = _frames(probe.wal, probe.start)
    turns = args.turns
    page = struct.unpack(">I", probe.wal[8:12])[0]
    print(f"{args.items} items stored before, then {turns} timed turns ({int(got['items'])} items after)")
    print(f"per turn: {got['statements']:.1f} SQL statements, {got['writes']:.2f} write transactions, "
          f"{commits / turns:.2f} WAL commits, {len(frames) / turns:.1f} WAL frames "
          f"({len(frames) * (page + _FRAME_HEADER) / turns / 1024:.0f} KiB)")
    names = {**probe.owners, 1: "page 1: sqlite_schema's root and the file's header (its size in pages)"}
    by_tree = collections.Counter(names.get(p, f"page {p}") for p in frames)
    print("WAL frames per turn, by b-tree:")
    for name, n in by_tree.most_common(args.top):
        print(f"  {n / turns:6.2f}  {name}")


def _salt(wal: bytes) -> bytes | None:
    return wal[16:24] if len(wal) >= _WAL_HEADER else None


def _frames(wal: bytes, start: int) -> tuple[list[int], int]:
    """The page number of each frame appended after `start`, and how many of them end a commit.

    Frames of the WAL's current salt only: a frame left over from before a restart of
    the WAL is not part of this run."""
    page = struct.unpack(">I", wal[8:12])[0]
    size = _FRAME_HEADER + page
    salt = _salt(wal)
    pages, commits = [], 0
    offset = max(start, _WAL_HEADER)
    while offset + size <= len(wal):
        number, commit = struct.unpack(">II", wal[offset:offset + 8])
        if wal[offset + 8:offset + 16] != salt:
            break
        pages.append(number)
        commits += commit != 0
        offset += size
    return pages, commits


if __name__ == "__main__":
    main()
