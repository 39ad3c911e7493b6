"""What decoding a runner frame costs, beside `json.loads` of the same text (issue 10).

The server decodes every frame a runner sends it, and a runner every frame the server
sends: a few a turn each way, on the event loop. `protocol.decode` parses the JSON
(bounded first), then checks every field against the frame class's type hints.
This times `decode` and bare `json.loads` on three frames a lone turn carries,
in this process, and prints each as µs per decode and as a ratio to the floor
(`python -c "import openai, trio"`) timed in the same run. Prints figures; asserts nothing.

    python scripts/bench_codec.py [--decodes 20000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import protocol as p  # noqa: E402
from bench_run import floor_seconds  # noqa: E402  (a sibling script)

_ITEM = {"type": "message", "id": "msg_x", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Hello there, how can I help?", "annotations": []}]}
_TURN = "turn_" + "a" * 32


def _frames() -> dict[str, str]:
    return {
        "turn.completed": p.encode(p.TurnCompleted(_TURN, "resp_1", [_ITEM], {"input_tokens": 10, "output_tokens": 5})),
        "turn.event (an item done)": p.encode(p.TurnEvent(_TURN, {"type": "response.output_item.done", "item": _ITEM,
                                                                  "output_index": 0})),
        "turn.start (4 items)": p.encode(p.TurnStart(_TURN, "conv_x", 1, {"name": "bench"}, [_ITEM] * 4, "mock-model")),
    }


def _per_call(fn, raw: str, n: int) -> float:
    best = []
    for _ in range(3):  # the best of three rounds: the least disturbed by the machine
        started = time.perf_counter()
        for _ in range(n):
            fn(raw)
        best.append((time.perf_counter() - started) / n)
    return min(best)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decodes", type=int, default=20000)
    args = parser.parse_args()
    before = floor_seconds()
    rows = [(name, len(raw), _per_call(p.decode, raw, args.decodes), _per_call(json.loads, raw, args.decodes))
            for name, raw in _frames().items()]
    floor = (before + floor_seconds()) / 2
    print(f"floor (python -c 'import openai, trio'): {floor * 1000:.0f} ms (three runs before the timing and three after, medians averaged)")
    print("| frame | bytes | decode µs (× floor) | json.loads µs | decode over json.loads |")
    print("| --- | --- | --- | --- | --- |")
    for name, size, decode, loads in rows:
        print(f"| {name} | {size} | {decode * 1e6:.1f} ({decode / floor:.1e}×) | {loads * 1e6:.1f} | "
              f"{decode / loads:.2f}× |")


if __name__ == "__main__":
    main()
