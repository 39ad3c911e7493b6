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
- What is ready together goes out together (`more_now`): the frames that can go with the
  one `next` returned without waiting, which the send loop writes in one system call
  (`ws_writes.py`). A streamed answer's last deltas and its end come from one read of
  the model's stream: written one by one, the first write woke the server to store and
  publish the deltas alone, a transaction and a write to each watcher more (a 100-word
  answer: the server's CPU a lone turn 7.3 ms against 7.8 since).

A step's last items, when the server acknowledged `ITEMS_IN_COMPLETED` (`acknowledged`):
- A turn's `response.output_item.done` events wait, up to `window` s, for the turn's
  next frame. When that is its `TurnCompleted` and its `output` ends with those very
  items, the events are not sent: the `TurnCompleted` goes with `unannounced` saying
  how many, and the server publishes their events from it, in the same place of the
  stream. One websocket message less a turn, on each side.
- Any other next frame of the turn (a delta of its next item, a failure, a tool's
  frame), or the window's end, sends the events first, as they came.
- A link to a server that does not fold (`acknowledged(False, ...)`, after a redial)
  gets every event back, in front of its `TurnCompleted`, even for what was folded
  already: that server's strict decoding would refuse the field.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from typing import Any, TypeGuard

import trio

from protocol import Frame, TurnCompleted, TurnEvent
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
        self._fold_items = False  # the server acknowledged ITEMS_IN_COMPLETED (set per hello: `acknowledged`)
        self._held: dict[str, _Held] = {}  # a turn's item events waiting for its next frame
        self._waiting: Queued | None = None  # a delta `more_now` took whose window was open: next first

    async def next(self) -> Queued:
        """The next frame to send: the first one queued, or one of the batch it began."""
        while not self._ready:
            await self._take(await self._first())
        return self._ready.popleft()

    async def more_now(self) -> list[Queued]:
        """What can go out with the frame `next` just returned, in order, with no wait: what is
        collected already, then what is queued, up to a delta whose window is still open
        (that one stays first in line, for `next` to wait for its window as ever)."""
        while self._waiting is None:
            try:
                queued = self._queued.receive_nowait()
            except trio.WouldBlock:
                break
            if _is_delta(queued[0]) and trio.current_time() < self._delta_at + self.window:
                self._waiting = queued
                break
            await self._take(queued)  # never waits: a delta here finds its window ended
        ready = list(self._ready)
        self._ready.clear()
        return ready

    def acknowledged(self, fold_items: bool, unsent: list[Queued] | None) -> None:
        """A new link's hello was acknowledged: fold items for it or not. `unsent`, the frames
        the last link did not send, go first again (`next`), unfolded for a server that
        does not fold."""
        self._fold_items = fold_items
        if unsent:
            self._ready.extendleft(reversed(unsent))
        if fold_items:
            return
        for turn_id in list(self._held):
            self._release(turn_id)
        self._ready = deque(q for queued in self._ready for q in _unfolded(queued))

    async def _take(self, first: Queued | None) -> None:
        """The next batch into `_ready`: `first` (None: none) and, when it is a delta, what comes
        until the window ends or a frame that is not a delta does, each turn's deltas merged.
        Item events whose window ended go into it too (and may be all it holds)."""
        if first is None or not _is_delta(first[0]):
            if first is not None:
                self._route(first)
            self._release_due()
            return
        self._release(first[0].turn_id)
        self._ready.append(first)
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
                    self._route(following)  # not merged: the batch goes now, this after it (or held)
                    break
                at = open_.get(frame.turn_id)
                if at is not None and sizes[at] < MAX_MERGED and _continues(self._ready[at][0], frame):
                    texts[at].append(frame.event["delta"])
                    sizes[at] += len(texts[at][-1])
                else:  # this turn's first here, another item's text, or a merge full
                    self._release(frame.turn_id)
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
        self._release_due()

    async def _first(self) -> Queued | None:
        """The next frame queued; None when a held item's window ended first."""
        if self._waiting is not None:
            first, self._waiting = self._waiting, None
            return first
        if not self._held:
            return await self._queued.receive()
        with trio.move_on_at(min(held.until for held in self._held.values())):
            return await self._queued.receive()
        return None

    def _route(self, queued: Queued) -> None:
        """A frame that is not a merged delta: into `_ready`, or held (an item's event), or
        folded into the `TurnCompleted` it precedes (the module docstring)."""
        frame = queued[0]
        if self._fold_items and _is_item_done(frame):
            held = self._held.get(frame.turn_id)
            if held is None:
                held = self._held[frame.turn_id] = _Held(trio.current_time() + self.window)
            held.events.append(queued)
            return
        turn_id = getattr(frame, "turn_id", None)
        held = self._held.pop(turn_id, None) if isinstance(turn_id, str) else None
        if held is not None:
            items = [event.event["item"] for event, _ in held.events]  # type: ignore[attr-defined]
            if (self._fold_items and isinstance(frame, TurnCompleted) and not frame.unannounced
                    and frame.output[len(frame.output) - len(items):] == items):
                self._ready.append((dataclasses.replace(frame, unannounced=len(items)), queued[1]))
                return
            self._ready.extend(held.events)
        self._ready.append(queued)

    def _release(self, turn_id: str) -> None:
        """The turn's held item events, into `_ready` as they came."""
        held = self._held.pop(turn_id, None)
        if held is not None:
            self._ready.extend(held.events)

    def _release_due(self) -> None:
        now = trio.current_time()
        for turn_id in [turn_id for turn_id, held in self._held.items() if held.until <= now]:
            self._release(turn_id)


@dataclasses.dataclass
class _Held:
    """A turn's `output_item.done` events, kept until `until` for its `TurnCompleted`."""

    until: float
    events: list[Queued] = dataclasses.field(default_factory=list)


def _is_item_done(frame: Frame) -> TypeGuard[TurnEvent]:
    """An item's end exactly as the harness makes it (`type`, `turn_id`, `item`): rebuilt the same
    from the `TurnCompleted` it is folded into, by the server or by `_unfolded`."""
    return (isinstance(frame, TurnEvent) and frame.event.get("type") == ev.ITEM_DONE
            and frame.event.keys() == {"type", "turn_id", "item"} and frame.event["turn_id"] == frame.turn_id
            and isinstance(frame.event["item"], dict))


def _unfolded(queued: Queued) -> list[Queued]:
    """A folded `TurnCompleted` as it was queued: its items' events, then itself without the count."""
    frame, turn = queued
    if not isinstance(frame, TurnCompleted) or not frame.unannounced:
        return [queued]
    events: list[Queued] = [(TurnEvent(frame.turn_id, ev.make_event(ev.ITEM_DONE, turn_id=frame.turn_id, item=item)),
                             turn) for item in frame.unannounced_items()]
    return [*events, (dataclasses.replace(frame, unannounced=0), turn)]


def _is_delta(frame: Frame) -> TypeGuard[TurnEvent]:
    return (isinstance(frame, TurnEvent) and frame.event.get("type") == ev.TEXT_DELTA
            and isinstance(frame.event.get("delta"), str) and "sequence_number" not in frame.event)


def _continues(frame: Frame, following: TurnEvent) -> bool:
    """Whether `following` is the next piece of `frame`'s text: all but the text equal."""
    if not isinstance(frame, TurnEvent):
        return False
    mine, theirs = frame.event, following.event
    return mine.keys() == theirs.keys() and all(mine[k] == theirs[k] for k in mine if k != "delta")
