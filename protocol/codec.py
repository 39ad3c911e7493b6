"""Frames to JSON text and back: one compact object per frame, decoded strictly.

Every frame is one JSON object with a `kind`. Decoding is strict: an unknown
kind, a missing, extra or mistyped field, an oversized frame or another
protocol version raises `ProtocolError`, so bad peers fail loudly at the edge
instead of deep inside the server. `FRAME_TYPES`, the registry `decode`
looks kinds up in, is built from the lists the frame modules keep of their
own classes.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any

from .errors import ProtocolError
from .frame import LINK_FRAMES, PROTOCOL_VERSION, Frame
from .host_frames import HOST_FRAMES
from .jsonobj import load_object
from .runner_frames import RUNNER_FRAMES

MAX_FRAME_BYTES = 16 * 1024 * 1024
# values in one frame (a turn's whole output, a long history): bounds the time a parse can take
MAX_FRAME_VALUES = 1_000_000


FRAME_TYPES: dict[str, type[Frame]] = {cls.kind: cls for cls in (*RUNNER_FRAMES, *LINK_FRAMES, *HOST_FRAMES)}


def encode(frame: Frame) -> str:
    """One frame as compact JSON.

    Shallow on purpose: frames hold only JSON values, so `dataclasses.asdict`'s
    deep copy bought nothing and cost 30 ms for a 2,000-item turn start, on the
    server's event loop, on every turn. json.dumps walks the values anyway.
    """
    data = {"kind": frame.kind}
    for name in _field_names(type(frame)):
        value = getattr(frame, name)
        if name in _OMITTED_WHEN_EMPTY and not value:
            continue  # a peer of before these fields reads the frame as it always did
        data[name] = value
    return json.dumps(data, separators=(",", ":"))


# Optional fields added without a version bump: left out at their default, so a runner or
# server that predates them (strict decoding refuses unknown fields) still reads the frame.
_OMITTED_WHEN_EMPTY = frozenset({"features", "history_from", "history_hash"})


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def decode(raw: str | bytes) -> Frame:
    if len(raw) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(raw)} bytes exceeds {MAX_FRAME_BYTES}", ProtocolError.TOO_LARGE)
    data = load_object(raw, "frame", max_values=MAX_FRAME_VALUES)
    kind = data.pop("kind", None)
    cls = FRAME_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown frame kind {kind!r}")
    frame = _build(cls, data)
    version = getattr(frame, "protocol_version", PROTOCOL_VERSION)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version {version} is not supported (this side speaks {PROTOCOL_VERSION})",
            ProtocolError.VERSION,
        )
    return frame


def _build(cls: type[Frame], data: dict[str, Any]) -> Frame:
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    extra = set(data) - set(fields)
    if extra:
        raise ProtocolError(f"{cls.kind}: unexpected field {sorted(extra)[0]!r}")
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ProtocolError(f"{cls.kind}: missing field {name!r}")
            continue
        if not _matches(data[name], hints[name]):
            raise ProtocolError(f"{cls.kind}: field {name!r} must be {_describe(hints[name])}")
    return cls(**data)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _matches(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is Any:
        return True
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(_matches(v, item) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(isinstance(k, str) for k in value)
    return isinstance(value, hint)


def _describe(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


__all__ = ["FRAME_TYPES", "MAX_FRAME_BYTES", "MAX_FRAME_VALUES", "decode", "encode"]
