"""A peer's text parsed into one JSON object, or one ProtocolError saying why not.

Parsing is bounded before it starts. The C decoder holds the GIL (and so the
event loop) for the whole document, and recurses once per nesting level, so a
hostile document is measured first with C-speed scans that never recurse:
strings are cut out, and what is left gives the nesting depth and an upper
bound on the number of values. Too deep or too many values is refused without
building anything; what passes is parsed by `json.loads`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import ProtocolError

MAX_DEPTH = 64  # objects/arrays inside each other; real frames use under 10

_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def load_object(raw: str | bytes, what: str, *, max_depth: int = MAX_DEPTH,
                max_values: int | None = None) -> dict[str, Any]:
    """`raw` as a JSON object nested at most `max_depth` deep, with at most `max_values` values.

    Bytes must be UTF-8 (RFC 8259). Every failure is a ProtocolError naming
    `what`; too many values has close code TOO_LARGE.
    """
    data = load_json(raw, what, max_depth=max_depth, max_values=max_values)
    if not isinstance(data, dict):
        raise ProtocolError(f"{what} is not a JSON object")
    return data


def load_json(raw: str | bytes, what: str, *, max_depth: int = MAX_DEPTH,
              max_values: int | None = None) -> Any:
    """Any JSON value, bounded like `load_object`."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"{what} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    else:
        text = raw
    check_shape(text, what, max_depth=max_depth, max_values=max_values)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ProtocolError(f"{what} is not JSON: {exc}") from None
    except RecursionError:  # cannot happen after check_shape; never let it out anyway
        raise ProtocolError(f"{what} is nested too deeply") from None


def check_shape(text: str, what: str, *, max_depth: int = MAX_DEPTH, max_values: int | None = None) -> None:
    """Refuse `text` if its JSON would nest deeper than `max_depth` or hold over `max_values` values.

    Works on the text with C-speed string operations only (no per-character
    Python loop, no regex backtracking): malformed text may pass (json.loads
    then says why), but a document that passes cannot exceed either bound.
    """
    skeleton = text
    if '"' in skeleton:
        # escapes out first (an escaped backslash before an escaped quote), then every
        # string is '"' + no quote + '"': the odd pieces of a split are the strings
        if "\\" in skeleton:
            skeleton = skeleton.replace("\\\\", "").replace('\\"', "")
        skeleton = "".join(skeleton.split('"')[::2])
    opens = skeleton.count("[") + skeleton.count("{")
    if max_values is not None:
        # every value but the first follows a ',' (arrays, objects) or a ':' (object values),
        # or opens an array or object: an upper bound, cheap to take
        values = 1 + skeleton.count(",") + skeleton.count(":") + opens
        if values > max_values:
            raise ProtocolError(f"{what} holds over {max_values} JSON values", ProtocolError.TOO_LARGE)
    if opens <= max_depth:  # cannot nest deeper than it has brackets
        return
    brackets = _NOT_BRACKET.sub("", skeleton).replace("{", "[").replace("}", "]")
    if "[" * (max_depth + 1) in brackets:  # a plain run that deep: no need to peel it
        raise ProtocolError(f"{what} is nested deeper than {max_depth} levels")
    # each pass removes the innermost pairs, which lowers the depth by exactly one
    for budget in range(max_depth, -1, -1):
        if brackets.count("[") <= budget:
            return
        shorter = brackets.replace("[]", "")
        if len(shorter) == len(brackets):  # only ']...][...[' is left: '[' count is its depth
            break
        brackets = shorter
    raise ProtocolError(f"{what} is nested deeper than {max_depth} levels")
