"""Where a process's CPU goes, by layer, from py-spy's raw samples (`bench_sessions.py --profile DIR`).

Each active sample (idle threads and the event loop's wait in epoll left out) is put in
one layer, by the frames on its stack:
  - framework: a frame of hypercorn (with our subclasses of it, server/connections.py),
    quart, quart-trio, wsproto, h11, werkzeug or trio-websocket below our deepest frame, or with none of ours (with the trio work under
    them: a send's lock, the socket's syscalls). Our route handlers run under quart's
    frames; what they do themselves is not the framework's;
  - store: the deepest frame of ours is in omnigent/store (SQLite, and the store's Python
    around each statement), or sqlite-utils is under it; the WAL checkpointer's thread too;
  - scheduler: no frame of ours and none of the framework (trio's run loop itself);
  - omnigent: the rest under a frame of ours (our code, json, the trio primitives it calls).

Prints the share of each layer and the heaviest outermost frames of ours. Prints figures;
asserts nothing.

Usage: python scripts/bench_sessions.py --lone 400 --profile /tmp/prof
       python scripts/profile_layers.py /tmp/prof/lone-server.txt
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

FRAMEWORK = ("(hypercorn/", "(quart/", "(quart_trio/", "(wsproto/", "(h11/", "(werkzeug/", "(trio_websocket/")
OURS = ("(omnigent/", "(protocol/", "(supervisor/")
ENTRY = ("omnigent/cli.py", "omnigent/__main__.py")  # on every stack of the server: not a layer
# hypercorn's own classes, subclassed (omnigent/server/connections.py): framework, not ours
NOT_OURS = ENTRY + ("omnigent/server/connections.py",)
IDLE = ("WorkerThread._work", "get_events (trio/_core/_io_epoll.py:243)")


def layer(frames: list[str]) -> str:
    # our route handlers run under quart's frames: what counts is what is below our deepest frame
    ours = [i for i, f in enumerate(frames) if any(o in f for o in OURS) and not any(e in f for e in NOT_OURS)]
    below = frames[ours[-1] + 1:] if ours else frames
    if any(w in f for f in below for w in FRAMEWORK):
        return "framework"
    if not ours:
        return "scheduler"
    deepest = frames[ours[-1]]
    if "(omnigent/store/" in deepest or "checkpoints.py" in deepest or any("(sqlite_utils/" in f for f in below):
        return "store"
    return "omnigent"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("raw", type=Path, help="a py-spy --format raw file")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    layers: collections.Counter[str] = collections.Counter()
    outermost: collections.Counter[str] = collections.Counter()
    total = 0
    for line in args.raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames, n = stack.split(";"), int(count)
        if frames[-1].startswith(IDLE[0]) or IDLE[1] in frames[-1]:
            continue
        total += n
        layers[layer(frames)] += n
        ours = [f for f in frames if any(o in f for o in OURS) and not any(e in f for e in NOT_OURS)]
        if ours:
            outermost[ours[0].split(" (")[0]] += n
    if not total:
        raise SystemExit(f"{args.raw}: no active samples")
    print(f"{args.raw.name}: {total} active samples")
    for name, n in layers.most_common():
        print(f"  {name:10} {100 * n / total:5.1f} %")
    print("heaviest outermost frames of ours (inclusive):")
    for name, n in outermost.most_common(args.top):
        print(f"  {100 * n / total:5.1f} %  {name}")


if __name__ == "__main__":
    main()
