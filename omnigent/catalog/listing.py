"""`omnigent sessions list` as a table: id, last activity, size, agent, name (and the match of a search).

Pure: rows in (`backend.public_row`), lines out. Every value from the store
is neutralised; the last column is cut to the terminal's width.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..repl.safe import neutralise

from ..repl.table import clip, display_width, format_table

__all__ = ["age", "display_width", "format_table", "table"]

NAME_WIDTH = 40  # the name column when a search's match follows it


def age(seconds: float) -> str:
    """`just now`, `5 min ago`, `3 h ago`, `2 d ago` (as the resume picker says it)."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return "just now"


def _one_line(text: Any) -> str:
    return " ".join(neutralise(str(text or "")).split())


def table(rows: Sequence[dict[str, Any]], now: float, *, max_width: int | None = None) -> list[str]:
    """The lines of the listing (a header first); with snippets (a search) a MATCH column ends it."""
    search = any("snippet" in r for r in rows)
    headers = ["ID", "UPDATED", "MSGS", "AGENT", "NAME"] + (["MATCH"] if search else [])
    cells = []
    for r in rows:
        name = _one_line(r.get("title")) or "(untitled)"
        row = [_one_line(r["id"]), age(max(0.0, now - (r.get("updated_at") or now))),
               str(r.get("message_count") or 0), _one_line(r.get("agent_name")),
               clip(name, NAME_WIDTH) if search else name]
        if search:
            row.append(_one_line(r.get("snippet")))
        cells.append(row)
    return format_table(headers, cells, max_width=max_width)
