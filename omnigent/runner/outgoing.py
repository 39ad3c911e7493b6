"""The outbox as the send loop reads it: each turn's frames in order, a model's text deltas merged.

Why: a model streams a delta per token, and each one was a frame to the server, an
event it stored and a websocket message to every watcher. A 100-word answer cost the
server ~27 ms of CPU against ~8.5 ms for the same answer unstreamed (~0.2 ms a delta).

What it guarantees:
- Only text deltas are merged: consecutive `response.output_text.delta` events of one
  turn whose other fields are all equal, their texts joined in order. What a watcher
  assembles from them is the same text; only the pieces are fewer and longer.
- A turn's frames keep their order. A frame that is not a delta (an item's end, a
  turn's end, a tool's frames) is never held: it ends the batch being collected and
  goes out right after it. Frames of different turns may overtake each other (a
  turn's later delta joins its earlier one): they go to different turns on the server.
- A batch of deltas goes out at once when none went out in the last `DELTA_WINDOW` s,
  so the first token of a lone answer waits for nothing. Deltas that come faster wait
  at most until `DELTA_WINDOW` after the last batch, each turn's merged: at most ~50
  delta frames a second per turn the runner streams, however fast its models are,
  and as many turns' deltas as came meanwhile in each batch. The server's hub writes
  deltas to the same rule (server/hub.py), so watchers see the same rhythm.
- A merged delta stops at `MAX_MERGED` characters, so its frame stays cheap to encode here.
- Nothing taken from the outbox is lost when the send loop is cancelled (a dropped
  link): what a cancelled call collected is handed out by the next one.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, TypeGuard

import trio

from protocol import Frame, TurnEvent
from protocol import events as ev

DELTA_WINDOW = 0.02  # s: as the server's hub batches deltas (server/hub.py BATCH_INTERVAL)
MAX_MERGED = 16 * 1024  # characters of one merged delta

Queued = tuple[Frame, Any]  # a frame and the turn it belongs to (runner/turns.py), as queued


class Outgoing:
    """Reads the turns' outbox for the send loop, merging text deltas (see the module docstring)."""

    def __init__(self, queued: trio.MemoryReceiveChannel[Queued], window: float = DELTA_WINDOW) -> None:
        self._queued = queued
        self.window = window
        self._ready: deque[Queued] = deque()  # collected, in the order they go out
        self._delta_at = -math.inf  # when the last batch with deltas was handed out

    async def next(self) -> Queued:
        """The next frame to send: the first one queued, or one of the batch it began."""
        if not self._ready:
            await self._collect()
        return self._ready.popleft()

    async def _collect(self) -> None:
        """The next batch into `_ready`: the first frame queued and, when it is a delta, what comes
        until the window ends or a frame that is not a delta does, each turn's deltas merged."""
        first = await self._queued.receive()
        self._ready.append(first)
        if not _is_delta(first[0]):
            return
        open_: dict[str, int] = {first[0].turn_id: 0}  # each turn's merge: its place in `_ready`
        texts: dict[int, list[str]] = {0: [first[0].event["delta"]]}
        sizes: dict[int, int] = {0: len(texts[0][0])}
        deadline = self._delta_at + self.window
        try:
            while True:
                try:
                    following = self._queued.receive_nowait()
                except trio.WouldBlock:
                    if trio.current_time() >= deadline:  # none went out lately: these go at once
                        break
                    waited: Queued | None = None
                    with trio.move_on_at(deadline):
                        waited = await self._queued.receive()
                    if waited is None:
                        break
                    following = waited
                frame = following[0]
                if not _is_delta(frame):
                    self._ready.append(following)  # not held: the batch goes now, this after it
                    break
                at = open_.get(frame.turn_id)
                if at is not None and sizes[at] < MAX_MERGED and _continues(self._ready[at][0], frame):
                    texts[at].append(frame.event["delta"])
                    sizes[at] += len(texts[at][-1])
                else:  # this turn's first here, another item's text, or a merge full
                    at = open_[frame.turn_id] = len(self._ready)
                    self._ready.append(following)
                    texts[at], sizes[at] = [frame.event["delta"]], len(frame.event["delta"])
        finally:  # also when cancelled: what was taken goes out with the next call
            for at, joined in texts.items():
                if len(joined) > 1:
                    frame, turn = self._ready[at]
                    assert isinstance(frame, TurnEvent)
                    self._ready[at] = TurnEvent(frame.turn_id, {**frame.event, "delta": "".join(joined)}), turn
        self._delta_at = trio.current_time()


def _is_delta(frame: Frame) -> TypeGuard[TurnEvent]:
    return (isinstance(frame, TurnEvent) and frame.event.get("type") == ev.TEXT_DELTA
            and isinstance(frame.event.get("delta"), str) and "sequence_number" not in frame.event)


def _continues(frame: Frame, following: TurnEvent) -> bool:
    """Whether `following` is the next piece of `frame`'s text: all but the text equal."""
    if not isinstance(frame, TurnEvent):
        return False
    mine, theirs = frame.event, following.event
    return mine.keys() == theirs.keys() and all(mine[k] == theirs[k] for k in mine if k != "delta")
