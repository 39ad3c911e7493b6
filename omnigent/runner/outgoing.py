"""The outbox as the send loop reads it: frames in order, a model's text deltas merged.

Why: a model streams a delta per token, and each one was a frame to the server, an
event it stored and a websocket message to every watcher. A 100-word answer cost the
server ~27 ms of CPU against ~8 ms for the same answer unstreamed (~0.2 ms a delta).

What it guarantees:
- Only text deltas are merged: consecutive `response.output_text.delta` events of one
  turn whose other fields are all equal, their texts joined in order. What a watcher
  assembles from them is the same text; only the pieces are fewer and longer.
- Frames keep their order. Any other frame (an item's end, the turn's end, another
  turn's delta) ends a merge and goes out after it, never before, and never later
  than it would have: it is not held.
- A delta goes out at once when no delta went out in the last `DELTA_WINDOW` s, so
  the first token of an answer waits for nothing. Deltas that come faster wait at
  most until `DELTA_WINDOW` after the last one sent, merged: at most ~50 delta frames
  a second per runner, however fast the model streams. The server holds deltas for
  up to 20 ms anyway (its hub's batch interval), so watchers see them in the same
  rhythm.
- A merge stops at `MAX_MERGED` characters, so the frame stays cheap to encode here.
"""

from __future__ import annotations

import math
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
        self._ahead: Queued | None = None  # taken from the outbox to end a merge; next out
        self._delta_at = -math.inf  # when the last delta was handed out

    async def next(self) -> Queued:
        """The next frame to send, with the text deltas right behind it merged in when it is one."""
        if self._ahead is not None:
            first, self._ahead = self._ahead, None
        else:
            first = await self._queued.receive()
        frame, turn = first
        if not _is_delta(frame):
            return first
        parts, size = [frame.event["delta"]], len(frame.event["delta"])
        deadline = self._delta_at + self.window
        while size < MAX_MERGED:
            try:
                following = self._queued.receive_nowait()
            except trio.WouldBlock:
                if trio.current_time() >= deadline:  # none went out lately: this one goes at once
                    break
                waited: Queued | None = None
                try:
                    with trio.move_on_at(deadline):
                        waited = await self._queued.receive()
                except BaseException:  # the send loop is cancelled (a dropped link): keep what was taken
                    self._ahead = _joined(frame, parts), turn
                    raise
                if waited is None:
                    break
                following = waited
            piece = following[0]
            if not (_is_delta(piece) and _continues(frame, piece)):
                self._ahead = following
                break
            parts.append(piece.event["delta"])
            size += len(parts[-1])
        self._delta_at = trio.current_time()
        return _joined(frame, parts), turn


def _joined(frame: TurnEvent, parts: list[str]) -> TurnEvent:
    return frame if len(parts) == 1 else TurnEvent(frame.turn_id, {**frame.event, "delta": "".join(parts)})


def _is_delta(frame: Frame) -> TypeGuard[TurnEvent]:
    return (isinstance(frame, TurnEvent) and frame.event.get("type") == ev.TEXT_DELTA
            and isinstance(frame.event.get("delta"), str) and "sequence_number" not in frame.event)


def _continues(frame: TurnEvent, following: TurnEvent) -> bool:
    """Whether `following` is the next piece of `frame`'s text: the same turn, all but the text equal."""
    mine, theirs = frame.event, following.event
    return (following.turn_id == frame.turn_id and mine.keys() == theirs.keys()
            and all(mine[k] == theirs[k] for k in mine if k != "delta"))
