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
from collections.abc import Callable
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
_OMITTED_WHEN_EMPTY = frozenset({"features", "history_from", "history_hash", "unannounced"})


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
    schema = _SCHEMAS.get(cls) or _schema(cls)
    if not schema.names.issuperset(data):
        extra = set(data) - schema.names
        raise ProtocolError(f"{cls.kind}: unexpected field {sorted(extra)[0]!r}")
    for name, required, check, hint in schema.fields:
        if name not in data:
            if required:
                raise ProtocolError(f"{cls.kind}: missing field {name!r}")
            continue
        if check is not None and not check(data[name]):
            raise ProtocolError(f"{cls.kind}: field {name!r} must be {_describe(hint)}")
    return cls(**data)


class _Schema(typing.NamedTuple):
    """What `_build` checks of one frame class, worked out once from its type hints: each
    decode then runs only the checks (a frame a turn, every turn, on the server's loop)."""

    names: frozenset[str]
    fields: tuple[tuple[str, bool, Callable[[Any], bool] | None, Any], ...]  # name, required, check, hint


_SCHEMAS: dict[type, _Schema] = {}


def _schema(cls: type) -> _Schema:
    hints = typing.get_type_hints(cls)
    fields = tuple(
        (f.name, f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
         _checker(hints[f.name]), hints[f.name])
        for f in dataclasses.fields(cls))
    schema = _SCHEMAS[cls] = _Schema(frozenset(name for name, *_ in fields), fields)
    return schema


def _checker(hint: Any) -> Callable[[Any], bool] | None:
    """A predicate for values of `hint` as JSON decodes them (None: anything goes).

    bool is not an int or a float here, although Python's isinstance says it is."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        checks = [_checker(h) for h in typing.get_args(hint)]
        if any(c is None for c in checks):
            return None
        return lambda value: any(c(value) for c in checks)  # type: ignore[misc]
    if hint is type(None):
        return lambda value: value is None
    if hint is Any:
        return None
    if hint is float:
        return lambda value: isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return lambda value: isinstance(value, int) and not isinstance(value, bool)
    if origin is list:
        (item,) = typing.get_args(hint)
        each = _checker(item)
        if each is None:
            return lambda value: isinstance(value, list)
        return lambda value: isinstance(value, list) and all(map(each, value))
    if origin is dict:
        return lambda value: isinstance(value, dict) and all(isinstance(k, str) for k in value)
    return lambda value: isinstance(value, hint)


def _describe(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


__all__ = ["FRAME_TYPES", "MAX_FRAME_BYTES", "MAX_FRAME_VALUES", "decode", "encode"]
