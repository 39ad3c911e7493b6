"""Plain-text tables aligned by how wide text shows on a terminal, not by `len`.

A CJK character or most emoji take two columns, a combining accent or a
zero-width joiner none; padding with `str.ljust` would misalign every row
that holds one. `display_width` counts columns from the Unicode database
alone (no terminal is asked, nothing is imported beyond `unicodedata`), and
`format_table` pads each cell to its column's widest and cuts only the last
column, with `…`, so a whole table fits `max_width`. Pure: no I/O.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

ELLIPSIS = "…"
_GAP = "  "
# zero-width characters that are not combining marks (Mn/Me/Cf are handled by category)
_ZERO = {0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF}


def char_width(char: str) -> int:
    """Columns one code point takes: 0 (combining, format, control), 2 (wide, fullwidth), else 1."""
    code = ord(char)
    if code in _ZERO or 0xFE00 <= code <= 0xFE0F or 0x1F3FB <= code <= 0x1F3FF:
        return 0  # variation selectors and skin tones change the glyph before them, not its place
    category = unicodedata.category(char)
    if category in ("Mn", "Me", "Cf") or (category == "Cc" and code != 0x09):
        return 0
    if unicodedata.east_asian_width(char) in ("W", "F"):
        return 2
    return 1


def display_width(text: str) -> int:
    """How many terminal columns `text` takes (one line; a tab counts as one column)."""
    if text.isascii():
        return sum(1 for c in text if " " <= c <= "~" or c == "\t")
    return sum(char_width(c) for c in text)


def clip(text: str, width: int) -> str:
    """`text` cut to at most `width` columns, ending in `…` when cut; never splits a wide character."""
    if display_width(text) <= width:
        return text
    if width <= 0:
        return ""
    room = width - 1  # the ellipsis takes one column
    out: list[str] = []
    used = 0
    for char in text:
        w = char_width(char)
        if used + w > room:
            break
        out.append(char)
        used += w
    return "".join(out) + ELLIPSIS


def pad(text: str, width: int) -> str:
    """`text` padded with spaces on the right to `width` columns."""
    return text + " " * max(0, width - display_width(text))


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *,
                 max_width: int | None = None) -> list[str]:
    """The lines of a table: a header line (when `headers` is not empty), then one line per row.

    Columns are separated by two spaces and aligned by display width; no
    line has trailing spaces. With `max_width`, the last column is cut with
    `…` so that every line fits (the other columns are kept whole: they hold
    numbers and ids a user types back).
    """
    table = ([list(headers)] if headers else []) + [list(r) for r in rows]
    if not table:
        return []
    columns = max(len(r) for r in table)
    for row in table:
        row.extend("" for _ in range(columns - len(row)))
    widths = [max(display_width(row[c]) for row in table) for c in range(columns)]
    if max_width is not None and columns:
        before = sum(widths[:-1]) + len(_GAP) * (columns - 1)
        room = max(1, max_width - before)
        if widths[-1] > room:
            for row in table:
                row[-1] = clip(row[-1], room)
            widths[-1] = max(display_width(row[-1]) for row in table)
    return [_GAP.join(pad(cell, w) for cell, w in zip(row, widths)).rstrip() for row in table]
