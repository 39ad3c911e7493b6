"""A private stand-in for `omnigent/repl/table.py` (the `output` helper's), same signatures.

CONTRACT11 gives `format_table` and `display_width` to `repl/table.py`;
until that module lands, `sessions list` uses this copy. At merge the lead
points `listing.py`'s import at `omnigent.repl.table` and deletes this file.
Pure: no terminal I/O.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

ELLIPSIS = "…"


def _char_width(char: str) -> int:
    if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def display_width(text: str) -> int:
    """Columns `text` takes on a terminal: wide East Asian characters 2, combining marks 0."""
    return sum(_char_width(c) for c in text)


def clip(text: str, width: int) -> str:
    """`text` cut to at most `width` columns, ending in `…` when cut."""
    if display_width(text) <= width:
        return text
    out, used = [], 0
    for char in text:
        w = _char_width(char)
        if used + w > width - 1:
            break
        out.append(char)
        used += w
    return "".join(out) + ELLIPSIS if width >= 1 else ""


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *,
                 max_width: int | None = None) -> list[str]:
    """Lines with columns aligned by display width (two spaces apart), the last column cut to `max_width`."""
    table = [list(headers), *[list(r) for r in rows]]
    count = len(headers)
    widths = [max(display_width(row[c]) for row in table) for c in range(count - 1)]
    lines = []
    for row in table:
        cells = [cell + " " * (widths[c] - display_width(cell)) for c, cell in enumerate(row[:-1])]
        head = "  ".join(cells) + ("  " if cells else "")
        last = row[-1]
        if max_width is not None:
            last = clip(last, max(1, max_width - display_width(head)))
        lines.append((head + last).rstrip())
    return lines
