"""Frames to and from the server's socket, without holding the runner's loop.

A runner must answer pings while it is busy (the server kills one that
stays silent for 6 s), so nothing heavy runs on its loop: a frame larger
than `THREAD_CODEC_BYTES` (a long history coming in, a long answer going
out) is decoded or encoded in a worker thread, and a usual one here, where
it is cheaper than a thread's round trip. What goes out is never larger than
`MAX_FRAME_BYTES`, the limit the server reads with: a frame that would be is
dropped, and its turn fails with `frame_too_large` in its place.
"""

from __future__ import annotations

from typing import Any

import trio

from protocol import MAX_FRAME_BYTES, Frame, TurnCompleted, TurnFailed, decode, encode

from ._log import log

THREAD_CODEC_BYTES = 64 * 1024  # frames larger than this are decoded/encoded off the loop


async def decode_frame(raw: str | bytes) -> Frame:
    """The frame in `raw`; a `ProtocolError` when it is not one."""
    if len(raw) > THREAD_CODEC_BYTES:  # a long history: parsing it must not hold the loop
        return await trio.to_thread.run_sync(decode, raw)
    return decode(raw)


async def encode_outgoing(frame: Frame) -> str | bytes:
    """`frame` as sent, or its turn's failure when it exceeds the frame limit."""
    data = await _encode(frame)
    if len(data) > MAX_FRAME_BYTES:
        turn_id = getattr(frame, "turn_id", "?")
        log(f"turn {turn_id}: {frame.kind} frame of {len(data)} bytes exceeds the limit; dropped")
        data = encode(TurnFailed(turn_id, "frame_too_large",
                                 f"a {frame.kind} frame of {len(data)} bytes exceeds {MAX_FRAME_BYTES}"))
    return data


async def _encode(frame: Frame) -> str | bytes:
    # A turn's output can be large: then it is encoded off the loop. A usual one
    # (an answer of a few KB) is cheaper to encode here than a thread's round trip.
    if isinstance(frame, TurnCompleted) and _larger_than(frame.output, THREAD_CODEC_BYTES):
        return await trio.to_thread.run_sync(encode, frame)
    return encode(frame)


def _larger_than(value: Any, budget: int) -> bool:
    """Whether the strings in `value` (nested lists and dicts) add up to more than `budget` characters."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            budget -= len(item)
        elif isinstance(item, dict):
            budget -= 8 * len(item)
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        if budget < 0:
            return True
    return False
