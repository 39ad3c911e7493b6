"""Benchmark: one of the scripts here, this checkout's code against another revision's, in pairs.

On the 2-core development machine the second run of a back-to-back pair tends to
come out ahead (2026-12-07: ~1 ms of a lone turn's p50, either way round), so the
pairs alternate their order (ABBA...). The other revision runs from a temporary git
worktree, with `PYTHONPATH` pointing at it (its scripts too), and the worktree is
removed at the end.

Every row of the markdown tables the script prints is collected (a script that prints
none, as `bench_watchers.py`, is refused), and printed per row: each
run's value in its second column, this checkout's first, then the median of each side.
For `bench_sessions.py` a CPU row also gives the server's CPU over its runners' (its
"(server X, runners Y)"): the runners run the same code on both sides in a comparison
of server changes, so that ratio cancels the machine's drift, which ratios to a floor
timed in another process do not. Both absolutes follow it, so that a ratio that fell
because the runners' CPU rose is seen.

Prints figures; asserts nothing.

Usage: python scripts/bench_ab.py REV [--pairs 3] -- bench_sessions.py --lone 300 --paced-s 3 --closed-s 4
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_SPLIT = re.compile(r"\(server (\d+(?:\.\d+)?), runners (\d+(?:\.\d+)?)\)")
_PARENTHESIS = re.compile(r"\s*\([^)]*\d[^)]*\)")


def _run(root: Path, script: str, args: list[str], other: bool) -> str:
    env = dict(os.environ)
    if other:
        env["PYTHONPATH"] = str(root)
    out = subprocess.run([sys.executable, str(root / "scripts" / script), *args], cwd=root, env=env,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{script} failed in {root}: {out.stderr[-2000:]}")
    return out.stdout


def _rows(output: str) -> dict[str, list[str]]:
    """The tables' rows by their first cell, with what varies from run to run (a parenthesis
    with numbers: "(10 turns in 0.3 s)") left out of it, so the runs' rows line up."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and not set(cells[0]) <= {"-", " "} and cells[0] != "what":
            rows[_PARENTHESIS.sub("", cells[0])] = cells[1:]
    return rows


def _medians(values: list[str]) -> str:
    """The median of each number of a row's values, position by position ("+3.3 / +8.0 ms": both)."""
    numbers = [[float(n) for n in _NUMBER.findall(v)] for v in values]
    width = min((len(n) for n in numbers), default=0)
    return " / ".join(f"{statistics.median(n[i] for n in numbers):g}" for i in range(width)) or "-"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("rev", help="the revision to compare this checkout with")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("script", help="a script under scripts/ (then its arguments, after --)")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    worktree = Path(tempfile.mkdtemp(prefix="omnigent-ab-"))
    subprocess.run(["git", "worktree", "add", "--detach", "--force", str(worktree), args.rev], cwd=REPO,
                   check=True, capture_output=True)
    values: dict[str, dict[str, list[str]]] = defaultdict(lambda: {"this": [], "other": []})
    try:
        for pair in range(args.pairs):
            sides = [("this", REPO), ("other", worktree)]
            for side, root in sides if pair % 2 == 0 else sides[::-1]:
                print(f"pair {pair + 1}: {side}", file=sys.stderr, flush=True)
                for what, cells in _rows(_run(root, args.script, args.args, side == "other")).items():
                    values[what][side].append(cells[0])
                    split = _SPLIT.search(cells[-1])
                    if split:
                        server, runners = float(split.group(1)), float(split.group(2))
                        values[f"{what}: the server's CPU over its runners'"][side].append(f"{server / runners:.2f}")
                        # and both in ms: a ratio that fell because the runners' CPU rose shows here
                        values[f"{what}: the server's / its runners' ms"][side].append(f"{server:g} / {runners:g}")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO, capture_output=True)
        shutil.rmtree(worktree, ignore_errors=True)
    if not values:
        raise SystemExit(f"{args.script} printed no table rows (`| what | ... |`) to compare")
    print(f"this checkout against {args.rev}: {args.pairs} pair{'s' if args.pairs != 1 else ''} of `{args.script} {' '.join(args.args)}`, "
          "the order alternating; each run's value (· between runs), then each side's medians")
    print()
    print(f"| what | this checkout | {args.rev} | medians, this checkout | medians, {args.rev} |")
    print("| --- | --- | --- | --- | --- |")
    for what, sides in values.items():
        if not any(sides["this"] + sides["other"]):
            continue
        print(f"| {what} | {' · '.join(sides['this'])} | {' · '.join(sides['other'])} | "
              f"{_medians(sides['this'])} | {_medians(sides['other'])} |")


if __name__ == "__main__":
    main()
