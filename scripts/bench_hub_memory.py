"""What the event hub holds in memory for the sessions a long-running server has served.

Each session's memory log keeps at most `capacity` (10,000) events, and all of
them together at most `KEPT_EVENTS` while there is a store (server/hub.py):
past it, the logs of the sessions least recently published to are emptied and
their followers read the store. This prints, measured with tracemalloc in this
process:

- the bytes one kept text delta costs (its `_Kept` copy and, once a watcher
  asked, its JSON text), and so one full session log and the whole budget;
- what `--sessions` sessions of `--events` deltas each leave held, with a
  store (bounded by the budget) and without one (every log kept).

Counted bytes, not time: nothing here is compared with the floor. Asserts nothing.

    python scripts/bench_hub_memory.py [--sessions 15] [--events 10000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import tracemalloc
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from omnigent.server.hub import KEPT_EVENTS, EventHub  # noqa: E402
from omnigent.server.memory_log import event_json  # noqa: E402
from omnigent.store import Store  # noqa: E402
from protocol import events as ev  # noqa: E402


def _publish(hub: EventHub, session_id: str, count: int) -> None:
    for n in range(count):
        hub.publish(session_id, ev.TEXT_DELTA, turn_id="turn_" + "b" * 32, item_id="msg_" + "c" * 24,
                    output_index=0, content_index=0, delta=f"token {n % 97}")
    for event in hub._logs[session_id].entries:
        event_json(event)  # as a watcher would: the JSON text is kept with the event


def _held(hub: EventHub, sessions: list[str], events: int) -> int:
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for session_id in sessions:
        _publish(hub, session_id, events)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    return sum(s.size_diff for s in after.compare_to(before, "filename"))


async def main(sessions: int, events: int) -> None:
    one = _held(EventHub(None), ["conv_" + "a" * 32], events)
    per_event = one / events
    print(f"one kept text delta: {per_event:.0f} B; a full session log ({events:,} events): {one / 1e6:.1f} MB; "
          f"the budget across sessions (KEPT_EVENTS = {KEPT_EVENTS:,}): ~{KEPT_EVENTS * per_event / 1e6:.0f} MB")
    names = [f"conv_{n:032x}" for n in range(sessions)]
    bare = _held(EventHub(None), names, events)
    print(f"{sessions} sessions x {events:,} deltas, no store (every log kept): {bare / 1e6:.0f} MB")
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "chat.db")
        try:
            ids = [store.create_conversation(agent_id=None)["id"] for _ in range(sessions)]
            hub = EventHub(store)
            stored = _held(hub, ids, events)
            kept = sum(len(log_.entries) for log_ in hub._logs.values())
            print(f"{sessions} sessions x {events:,} deltas, with a store: {kept:,} events kept in memory, "
                  f"{stored / 1e6:.0f} MB of Python objects held")
        finally:
            store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=15)
    parser.add_argument("--events", type=int, default=10_000)
    args = parser.parse_args()
    trio.run(main, args.sessions, args.events)
