"""One session as a document: a plain transcript, Markdown, JSON Lines or one JSON object.

Pure text from what a backend returns (`backend.public_row` and the items
in wire form), so `show` and `export` read the same locally and through a
server. The two text forms have every control character but newline and
tab made visible (`repl.safe.neutralise`: what came from a model or a tool
cannot drive the terminal or hide in the file); the JSON forms keep every
character, escaped, with U+007F-U+009F escaped too (as `run -p --output-format
json` writes them).

JSON Lines: the first line is `{"type": "session", ...the session's fields}`,
each following line one item exactly as the API lists it (`id`, `type`,
`status`, `response_id`, `created_at` and the item's own fields), oldest first.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Iterator
from typing import Any

from ..repl.safe import neutralise

USER_MARK = "› "  # as the REPL shows a user message
CALL_MARK = "⚙"
RESULT_MARK = "↳"
_C1 = re.compile("[\x7f-\x9f]")
_FENCE = re.compile("`{3,}")


def dumps(obj: Any, *, indent: int | None = None) -> str:
    """JSON with non-ASCII as it is, but U+007F-U+009F escaped like the C0 controls are."""
    return _C1.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(obj, ensure_ascii=False, indent=indent))


def message_text(item: dict[str, Any]) -> str:
    """The visible text of a message item: its string content, or its text parts joined."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or ()
                   if isinstance(part, dict) and isinstance(part.get("text"), str))


def when(ts: Any) -> str:
    """A timestamp (epoch seconds) as local `YYYY-MM-DD HH:MM`, '' when there is none."""
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        return ""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def _text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # reasoning summaries, output parts
        return "\n".join(_text_of(v.get("text") if isinstance(v, dict) else v) for v in value)
    return "" if value is None else json.dumps(value, ensure_ascii=False)


def _arguments(item: dict[str, Any]) -> str:
    args = item.get("arguments")
    if isinstance(args, str):
        try:
            return json.dumps(json.loads(args), ensure_ascii=False)
        except ValueError:
            return args
    return "" if args is None else json.dumps(args, ensure_ascii=False)


def _kind(item: dict[str, Any]) -> str:
    kind = item.get("type") or "message"
    if kind == "message":
        return str(item.get("role") or "assistant")
    return str(kind)


# --- the plain transcript -------------------------------------------------------


def _header(session: dict[str, Any]) -> list[str]:
    facts = [session["id"], session.get("agent_name") or "", _count(session.get("message_count") or 0, "message"),
             f"updated {when(session.get('updated_at'))}" if session.get("updated_at") else ""]
    lines = [session.get("title") or "(untitled)", " · ".join(f for f in facts if f)]
    if session.get("forked_from"):
        lines.append(f"forked from {session['forked_from']}")
    return [neutralise(line) for line in lines]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _one_line(text: str, width: int = 100) -> str:
    text = " ".join(neutralise(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _result_line(output: Any, status: Any) -> str:
    lines = [line for line in neutralise(_text_of(output)).splitlines() if line.strip()]
    first = _one_line(lines[0], 80) if lines else "(no output)"
    more = f"  (+{len(lines) - 1} line{'s' if len(lines) > 2 else ''})" if len(lines) > 1 else ""
    state = f"{status}: " if status not in (None, "completed") else ""
    return f"  {RESULT_MARK} {state}{first}{more}"


def _plain_item(item: dict[str, Any]) -> str | None:
    kind = _kind(item)
    if kind == "user":
        text = neutralise(message_text(item)).strip("\n")
        return USER_MARK + text.replace("\n", "\n  ")
    if kind in ("assistant", "system", "developer"):
        text = neutralise(message_text(item)).strip("\n")
        return text if kind == "assistant" else f"[{kind}] {text}"
    if kind == "function_call":
        return f"  {CALL_MARK} {_one_line(str(item.get('name') or 'tool'), 40)} {_one_line(_arguments(item))}".rstrip()
    if kind == "function_call_output":
        return _result_line(item.get("output"), item.get("status"))
    if kind == "error":
        return f"  error: {_one_line(str(item.get('message') or ''))}"
    return None  # reasoning, compaction and other bookkeeping: not part of the conversation read aloud


def transcript(session: dict[str, Any], items: Iterable[dict[str, Any]]) -> str:
    """The session's header, then each message, call and result, as a person reads them."""
    blocks = ["\n".join(_header(session))]
    blocks += [b for b in (_plain_item(i) for i in items) if b is not None]
    return "\n\n".join(blocks) + "\n"


# --- Markdown ---------------------------------------------------------------------


def _fence(text: str, lang: str = "") -> str:
    """`text` in a code fence longer than any backtick run inside it."""
    longest = max((len(m.group()) for m in _FENCE.finditer(text)), default=2)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{text.rstrip(chr(10))}\n{ticks}"


def _code(text: str) -> str:
    """Inline code that survives backticks in `text`."""
    ticks = "`" * (max((len(m) for m in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _markdown_item(item: dict[str, Any]) -> str | None:
    kind = _kind(item)
    if kind in ("user", "assistant", "system", "developer"):
        text = neutralise(message_text(item)).strip("\n")
        return f"## {kind.capitalize()}\n\n{text}" if text else f"## {kind.capitalize()}"
    if kind == "function_call":
        name = neutralise(str(item.get("name") or "tool"))
        return f"**Tool call** {_code(name)}\n\n{_fence(neutralise(_arguments(item)), 'json')}"
    if kind == "function_call_output":
        status = item.get("status")
        state = f" ({neutralise(str(status))})" if status not in (None, "completed") else ""
        return f"**Tool result**{state}\n\n{_fence(neutralise(_text_of(item.get('output'))))}"
    if kind == "reasoning":
        text = neutralise(_text_of(item.get("summary"))).strip()
        return "> " + text.replace("\n", "\n> ") if text else None
    if kind == "error":
        return f"**Error:** {neutralise(str(item.get('message') or ''))}"
    return None


def markdown(session: dict[str, Any], items: Iterable[dict[str, Any]]) -> str:
    """The session as a Markdown document: a title, its facts, then one section per message."""
    title = neutralise(session.get("title") or "Untitled session")
    facts = [("Session", _code(session["id"])), ("Agent", neutralise(session.get("agent_name") or "")),
             ("Created", when(session.get("created_at"))), ("Updated", when(session.get("updated_at"))),
             ("Forked from", _code(session["forked_from"]) if session.get("forked_from") else "")]
    blocks = [f"# {title}", "\n".join(f"- **{k}:** {v}" for k, v in facts if v)]
    blocks += [b for b in (_markdown_item(i) for i in items) if b is not None]
    return "\n\n".join(blocks) + "\n"


# --- JSON ---------------------------------------------------------------------------


def jsonl(session: dict[str, Any], items: Iterable[dict[str, Any]]) -> Iterator[str]:
    """The lines of the JSON Lines export (see the module doc), each ending in a newline."""
    yield dumps({"type": "session", **session}) + "\n"
    for item in items:
        yield dumps(item) + "\n"


def document(session: dict[str, Any], items: Iterable[dict[str, Any]]) -> str:
    """`show --json`: the session's fields and its `items`, as one indented object."""
    return dumps({**session, "items": list(items)}, indent=2) + "\n"
