"""A session's worker lives while its session has turns to run, not for the server's life.

A long-running server serves ever more sessions; a worker task per idle one
(~3.4 KB each, never freed) would grow with the sessions served. The worker
ends once the queue is empty and the next message starts another (MockClock,
fake runners).
"""

from __future__ import annotations

import trio
import trio.lowlevel

from protocol import events as ev
from tests.support.fake_runners import answers, open_harness

TIMEOUT = 60  # virtual seconds


def _worker_tasks() -> list[str]:
    names: list[str] = []

    def walk(task: trio.lowlevel.Task) -> None:
        if task.name.startswith("turns:"):
            names.append(task.name)
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                walk(child)

    walk(trio.lowlevel.current_root_task())
    return names


async def test_an_idle_sessions_worker_ends_and_the_next_message_starts_one(autojump_clock, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [answers("one", after=0.5), answers("two", after=0.5)]) as h:
            await h.online(1)
            sid = h.new_session()
            for text in ("hi", "again"):
                user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
                with h.hub.transaction(sid) as tx:
                    item, turn = h.store.queue_message(sid, user)
                    tx.publish(ev.INPUT_CONSUMED, item=item, turn_id=turn["id"])
                h.turns.submit(sid)
                h.turns.submit(sid)  # twice before it runs: still one worker
                await trio.lowlevel.checkpoint()
                assert _worker_tasks() == [f"turns:{sid}"]
                await h.until_terminal(sid, turn["id"])
                await h.settle()
                assert _worker_tasks() == []
                assert h.store.get_turn(turn["id"])["status"] == "completed"
