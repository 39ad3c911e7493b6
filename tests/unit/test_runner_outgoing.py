"""The runner's outbox as its send loop reads it: text deltas merged, every frame in order (MockClock)."""

from __future__ import annotations

import pytest
import trio

from omnigent.runner.outgoing import DELTA_WINDOW, MAX_MERGED, Outgoing
from protocol import TurnCompleted, TurnEvent, TurnFailed
from protocol import events as ev


def delta(text: str, turn_id: str = "turn_a") -> TurnEvent:
    return TurnEvent(turn_id, ev.make_event(ev.TEXT_DELTA, turn_id=turn_id, delta=text))


def item_done(turn_id: str = "turn_a") -> TurnEvent:
    return TurnEvent(turn_id, ev.make_event(ev.ITEM_DONE, turn_id=turn_id, item={"type": "message"}))


def texts(frames: list) -> list:
    return [f.event.get("delta", f.event["type"]) if isinstance(f, TurnEvent) else f.kind for f in frames]


@pytest.fixture
def outbox():
    send, receive = trio.open_memory_channel(100)
    return send, Outgoing(receive)


async def take(outgoing: Outgoing, n: int) -> list:
    return [(await outgoing.next())[0] for _ in range(n)]


async def test_deltas_queued_together_go_as_one_and_what_follows_goes_after(outbox, autojump_clock):
    send, outgoing = outbox
    for frame in (delta("Hel"), delta("lo "), delta("there"), item_done(),
                  TurnCompleted("turn_a", "resp_1", [], None)):
        send.send_nowait((frame, "turn"))
    start = trio.current_time()
    got = await take(outgoing, 3)
    assert texts(got) == ["Hello there", ev.ITEM_DONE, "turn.completed"]
    assert trio.current_time() == start  # nothing waited: the first delta of a while goes at once
    assert got[0].event == ev.make_event(ev.TEXT_DELTA, turn_id="turn_a", delta="Hello there")


async def test_deltas_that_come_faster_than_the_window_wait_for_it_merged(outbox, autojump_clock):
    send, outgoing = outbox
    sent_at: list[tuple[float, str]] = []

    async def model() -> None:
        for n in range(6):  # a token every 6 ms
            send.send_nowait((delta(f"{n} "), None))
            await trio.sleep(0.006)

    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        nursery.start_soon(model)
        for _ in range(3):
            frame, _turn = await outgoing.next()
            sent_at.append((round(trio.current_time() - start, 4), frame.event["delta"]))
    # the first at once; then one frame per window, each with what came meanwhile
    assert sent_at == [(0.0, "0 "), (DELTA_WINDOW, "1 2 3 "), (2 * DELTA_WINDOW, "4 5 ")]


async def test_other_frames_are_never_held_by_a_window(outbox, autojump_clock):
    send, outgoing = outbox
    send.send_nowait((delta("a"), None))
    assert texts(await take(outgoing, 1)) == ["a"]

    async def later() -> None:
        await trio.sleep(0.003)
        send.send_nowait((delta("b"), None))
        await trio.sleep(0.002)
        send.send_nowait((item_done(), None))

    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        nursery.start_soon(later)
        got = await take(outgoing, 2)
    assert texts(got) == ["b", ev.ITEM_DONE]
    assert trio.current_time() - start == pytest.approx(0.005)  # the item's end came: nothing waits more


async def test_each_turns_deltas_merge_and_each_turns_frames_keep_their_order(outbox, autojump_clock):
    send, outgoing = outbox
    frames = [delta("a1"), delta("a2"), delta("b1", "turn_b"), delta("a3"), item_done("turn_b"), delta("b2", "turn_b")]
    for frame in frames:
        send.send_nowait((frame, None))
    got = await take(outgoing, 4)
    # turn_a's third delta joins its first two (turn_b's first went between them); turn_b's
    # item end is not held and ends the batch; its next delta starts the next one
    assert texts(got) == ["a1a2a3", "b1", ev.ITEM_DONE, "b2"]
    assert [f.turn_id for f in got] == ["turn_a", "turn_b", "turn_b", "turn_b"]


async def test_many_turns_streaming_at_once_send_a_frame_each_per_window(outbox, autojump_clock):
    send, outgoing = outbox
    turns = [f"turn_{n}" for n in range(5)]

    async def models() -> None:
        for word in range(8):  # five answers interleaved, a token each every 6 ms
            for turn_id in turns:
                send.send_nowait((delta(f"{word} ", turn_id), None))
            await trio.sleep(0.006)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(models)
        got = await take(outgoing, 5 * 3)
    # the first tokens at once, then what came in each window: every turn's text whole and in order
    assert [f.event["delta"] for f in got[:5]] == ["0 "] * 5
    assert [f.event["delta"] for f in got[5:10]] == ["1 2 3 "] * 5  # came at 6, 12 and 18 ms
    assert [f.event["delta"] for f in got[10:]] == ["4 5 6 "] * 5  # 24 to 36 ms, out at 40
    assert [f.turn_id for f in got] == turns * 3


async def test_a_merge_stops_at_its_size_and_keeps_every_character(outbox, autojump_clock):
    send, outgoing = outbox
    piece = "x" * 4096
    for _ in range(6):
        send.send_nowait((delta(piece), None))
    got = [f.event["delta"] for f in await take(outgoing, 2)]
    assert [len(text) for text in got] == [MAX_MERGED, len(piece) * 6 - MAX_MERGED]
    assert "".join(got) == piece * 6


async def test_a_send_loop_cancelled_in_the_window_loses_nothing(outbox, autojump_clock):
    send, outgoing = outbox
    send.send_nowait((delta("a"), None))
    await outgoing.next()  # a delta went out: the next ones wait for the window
    send.send_nowait((delta("b"), "turn"))
    with trio.move_on_after(DELTA_WINDOW / 2):  # the link drops while it waits
        await outgoing.next()
    send.send_nowait((delta("c"), "turn"))
    frame, turn = await outgoing.next()  # the next connection's send loop: what it had, then the rest
    assert (frame.event["delta"], turn) == ("b", "turn")
    assert (await outgoing.next())[0].event["delta"] == "c"


# --- a step's last items, folded into its TurnCompleted (ITEMS_IN_COMPLETED) -----------------

ITEM = {"id": "msg_1", "type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}


def done_of(item: dict, turn_id: str = "turn_a") -> TurnEvent:
    return TurnEvent(turn_id, ev.make_event(ev.ITEM_DONE, turn_id=turn_id, item=item))


def completed(output: list, turn_id: str = "turn_a") -> TurnCompleted:
    return TurnCompleted(turn_id, "resp_1", output, {"input_tokens": 1})


@pytest.fixture
def folding(outbox):
    send, outgoing = outbox
    outgoing.acknowledged(True, None)
    return send, outgoing


async def test_the_last_items_event_goes_in_its_turns_end_and_nothing_waits(folding, autojump_clock):
    send, outgoing = folding
    call = {"id": "fc_1", "type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"}
    for frame in (delta("hi"), done_of(ITEM), done_of(call), completed([ITEM, call])):
        send.send_nowait((frame, "turn"))
    start = trio.current_time()
    got = await outgoing.next(), await outgoing.next()
    assert [f.kind for f, _ in got] == ["turn.event", "turn.completed"] and got[1][1] == "turn"
    assert got[1][0] == TurnCompleted("turn_a", "resp_1", [ITEM, call], {"input_tokens": 1}, unannounced=2)
    assert trio.current_time() == start


async def test_an_items_event_goes_before_its_turns_next_frame_or_when_its_window_ends(folding, autojump_clock):
    send, outgoing = folding
    send.send_nowait((done_of(ITEM), None))
    send.send_nowait((delta("next item"), None))
    assert texts(await take(outgoing, 2)) == [ev.ITEM_DONE, "next item"]  # at once, in order
    start = trio.current_time()
    send.send_nowait((done_of(ITEM), None))
    assert texts(await take(outgoing, 1)) == [ev.ITEM_DONE]
    assert trio.current_time() - start == pytest.approx(DELTA_WINDOW)  # its end did not come: sent
    send.send_nowait((completed([ITEM]), None))
    [end] = await take(outgoing, 1)
    assert isinstance(end, TurnCompleted) and end.unannounced == 0  # its event went already


async def test_an_end_that_does_not_end_with_the_held_items_or_a_failure_gets_them_first(folding, autojump_clock):
    send, outgoing = folding
    other = {**ITEM, "id": "msg_2"}
    send.send_nowait((done_of(ITEM), None))
    send.send_nowait((completed([other]), None))
    got = await take(outgoing, 2)
    assert texts(got) == [ev.ITEM_DONE, "turn.completed"] and got[1].unannounced == 0
    send.send_nowait((done_of(ITEM, "turn_b"), None))
    send.send_nowait((TurnFailed("turn_b", "stream_dropped", "dropped", [ITEM]), None))
    assert texts(await take(outgoing, 2)) == [ev.ITEM_DONE, "turn.failed"]


async def test_other_turns_frames_pass_a_held_item_and_a_cancelled_send_loop_keeps_it(folding, autojump_clock):
    send, outgoing = folding
    send.send_nowait((done_of(ITEM), None))
    send.send_nowait((delta("b1", "turn_b"), None))
    assert texts(await take(outgoing, 1)) == ["b1"]
    with trio.move_on_after(DELTA_WINDOW / 2):  # the link drops while the item waits
        await outgoing.next()
    send.send_nowait((completed([ITEM]), None))
    [end] = await take(outgoing, 1)
    assert end.turn_id == "turn_a" and end.unannounced == 1


async def test_a_link_to_a_server_that_does_not_fold_gets_every_event_back(folding, autojump_clock):
    send, outgoing = folding
    send.send_nowait((done_of(ITEM), "a"))
    send.send_nowait((completed([ITEM]), "a"))
    unsent = await outgoing.next()  # taken by a send loop whose link dropped before it went
    assert unsent[0].unannounced == 1
    send.send_nowait((done_of(ITEM, "turn_b"), "b"))
    with trio.move_on_after(DELTA_WINDOW / 2):
        await outgoing.next()  # turn_b's item is held when the link drops
    outgoing.acknowledged(False, [unsent])  # the server the runner dialed next predates the feature
    got = [await outgoing.next() for _ in range(3)]
    assert got == [(done_of(ITEM), "a"), (completed([ITEM]), "a"), (done_of(ITEM, "turn_b"), "b")]
    send.send_nowait((completed([ITEM], "turn_b"), "b"))
    assert (await outgoing.next())[0].unannounced == 0


async def test_what_is_ready_with_a_frame_goes_with_it_and_a_delta_in_its_window_waits(folding, autojump_clock):
    send, outgoing = folding
    for frame in (delta("hi"), done_of(ITEM), completed([ITEM])):  # one read of a short answer's stream
        send.send_nowait((frame, "turn"))
    first = await outgoing.next()
    assert texts([first[0]]) == ["hi"]
    [end] = await outgoing.more_now()  # the item waited for its end, which came: both in one write
    assert isinstance(end[0], TurnCompleted) and end[0].unannounced == 1
    assert await outgoing.more_now() == []
    # a delta of the next step, 5 ms later: its window (from "hi") is open, so it is not ready now
    # and stays first in line, merged with what follows as ever; a frame behind it waits behind it
    await trio.sleep(0.005)
    start = trio.current_time()
    for frame in (delta("a", "turn_b"), delta("b", "turn_b"), TurnFailed("turn_b", "cancelled", "x")):
        send.send_nowait((frame, None))
    assert await outgoing.more_now() == []
    got = await take(outgoing, 2)
    assert texts(got) == ["ab", "turn.failed"] and trio.current_time() == start  # a failure ends the batch
    # once the window has ended, a delta queued is ready at once, with what follows it
    await trio.sleep(DELTA_WINDOW)
    send.send_nowait((TurnFailed("turn_c", "cancelled", "x"), None))
    send.send_nowait((delta("c", "turn_d"), None))
    send.send_nowait((delta("d", "turn_d"), None))
    send.send_nowait((TurnFailed("turn_d", "cancelled", "x"), None))
    assert texts(await take(outgoing, 1)) == ["turn.failed"]
    assert texts([f for f, _ in await outgoing.more_now()]) == ["cd", "turn.failed"]


async def test_frames_collected_before_a_dropped_link_come_first_in_more_now(folding, autojump_clock):
    send, outgoing = folding
    send.send_nowait((done_of(ITEM), "a"))
    send.send_nowait((completed([ITEM]), "a"))
    unsent = [await outgoing.next(), *await outgoing.more_now()]  # the batch whose write failed
    send.send_nowait((delta("later"), "a"))
    outgoing.acknowledged(True, unsent)
    got = [await outgoing.next(), *await outgoing.more_now()]
    assert [f.kind for f, _ in got] == ["turn.completed", "turn.event"] and got[0][0].unannounced == 1
