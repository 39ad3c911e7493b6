"""The runner's steps (omnigent/runner/turns.py): a step that emits its end before its task is done.

A Responses stream's end goes out as soon as its terminal event is read (streams.respond); the
step's task then reads the stream to its end. That end is the step's only one: a Cancel or the
turn's next step arriving meanwhile neither cuts the read short nor sends a second end.
"""

from __future__ import annotations

import trio

from protocol import Frame, TurnCompleted, TurnFailed, TurnStart
from omnigent.runner.turns import Turns


def _start(step: int) -> TurnStart:
    return TurnStart(turn_id="turn_1", session_id="conv_1", attempt=1, agent={"name": "a"},
                     input=[{"type": "message", "role": "user", "content": "hi"}], model="m", step=step)


async def test_an_end_emitted_early_is_the_steps_only_end_and_its_stream_is_read_to_the_end(autojump_clock):
    release, drained = trio.Event(), trio.Event()

    async def execute(start: TurnStart, emit, captured) -> Frame:
        end = TurnCompleted(start.turn_id, f"resp_{start.step}", [], None)
        if start.step == 0:
            await emit(end)  # the answer is known: it goes out before the stream's end is read
            await release.wait()  # ... the stream read to its end
            drained.set()
        return end

    turns = Turns(execute)
    sent: list[Frame] = []
    with trio.fail_after(30):  # virtual seconds: a step cut short would never drain
        await _run(turns, release, drained, sent)


async def _run(turns: Turns, release: trio.Event, drained: trio.Event, sent: list[Frame]) -> None:
    async with trio.open_nursery() as nursery:
        turns.nursery = nursery
        turns.start(_start(0))
        frame, owed = await turns.queued.receive()
        assert frame == TurnCompleted("turn_1", "resp_0", [], None) and len(turns) == 1
        turns.cancel("turn_1")  # after the answer: its end is on the way, nothing is cut short
        turns.start(_start(1))  # the turn's next step, while the first still reads its stream
        sent.append(frame)
        turns.sent(frame, owed)
        frame, owed = await turns.queued.receive()
        sent.append(frame)
        turns.sent(frame, owed)
        release.set()
        await drained.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert turns.queued.statistics().current_buffer_used == 0  # no second end of step 0
        assert not any(isinstance(f, TurnFailed) for f in sent)
        assert [f.response_id for f in sent] == ["resp_0", "resp_1"] and len(turns) == 0
        nursery.cancel_scope.cancel()
