"""A session's worker lives while its session has turns to run, not for the server's life.

A long-running server serves ever more sessions; a worker task per idle one
(~3.4 KB each, never freed) would grow with the sessions served. The worker
ends once the queue is empty and the next message starts another (MockClock,
fake runners).
"""

from __future__ import annotations

import trio
import trio.lowlevel

import protocol as p
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


async def test_a_turns_start_reaches_its_runner_before_the_watchers_read_its_message(autojump_clock, tmp_path):
    """`TurnService.submit` holds the session's followers (`EventHub.hold`) until the link has
    written the TurnStart: on 2 cores the dispatch's path is the latency a user waits for, and
    watchers woken first would run ahead of it. Not later either: no virtual time passes."""
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [answers("one", after=0.5)], stored_events=True) as h:
            await h.online(1)
            (proc,) = h.processes
            written: list[str] = []
            send = proc.transport.send

            async def recording_send(text: str) -> None:
                written.append(p.decode(text).__class__.__name__)
                await send(text)

            proc.transport.send = recording_send  # type: ignore[method-assign]
            sid = h.new_session()
            await h.settle()  # its watch is following
            read: list[tuple[float, list[str]]] = []

            async def watcher() -> None:
                async for event in h.hub.follow(sid, after=0):
                    if event["type"] == ev.INPUT_CONSUMED:
                        read.append((trio.current_time(), list(written)))
                        return

            async with trio.open_nursery() as nursery:
                nursery.start_soon(watcher)
                await h.settle()
                turn = h.post(sid, "hi")
            assert read == [(0, ["TurnStart"])]
            seen = await h.until_terminal(sid, turn["id"])
            assert (seen[0].time, seen[0].type) == (0, ev.INPUT_CONSUMED)  # the harness's own watch too


async def test_a_turn_posted_to_an_idle_session_runs_on_the_claim_its_message_took(autojump_clock, tmp_path):
    """The route queues a message with `Claims.queue_message`: the claim commits with it, and the
    worker that runs the turn only reads it, one write transaction a turn fewer. The claim is
    still released with the turn's end."""
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, [answers("one", after=0.5)]) as h:
            await h.online(1)
            sid = h.new_session()
            statements: list[str] = []
            h.store.conn.set_trace_callback(statements.append)
            user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
            with h.hub.transaction(sid) as tx:
                item, turn, _ = h.turns.claims.queue_message(sid, user)
                tx.publish(ev.INPUT_CONSUMED, item=item, turn_id=turn["id"])
            assert h.store.claim_of(sid)["turn_id"] == turn["id"]
            h.turns.submit(sid)
            await h.until_terminal(sid, turn["id"])
            await h.settle()
            h.store.conn.set_trace_callback(None)
            assert h.store.get_turn(turn["id"])["status"] == "completed"
            assert h.store.claim_of(sid) is None
            claims = [s.split(" (")[0] for s in statements if "INTO conversation_claims" in s]
            assert claims == ["INSERT INTO conversation_claims"]  # the message's; no claim taken again
