"""Markdown answers rendered for a terminal, a line at a time, never changing a word.

Why a renderer of our own: what a terminal needs is small (headings,
emphasis, lists, quotes, inline code, fenced code), and the rules that
matter most here are stricter than CommonMark's, so no parser's output could
be used as it is:

- **A line is rendered once it is complete** (its newline arrived), and
  never touched again, so streamed text does not jump. Emphasis therefore
  pairs within a line; an unpaired delimiter stays as it is.
- **The characters of the words are never changed.** A delimiter run of `*`
  or `_` opens emphasis only after a space, the line's start or an opening
  bracket or quote, and closes only before a space, the line's end or
  closing punctuation: `a_b_c`, `2*3*4`, `/usr/*/bin/*` and
  `SESSION_LIFECYCLE_OK` stay literal (CommonMark would make `2*3*4` and the
  path emphasis). `_` pairs only around text holding a space, so names
  such as `__init__` stay whole. URLs are left alone. So a style code always sits at a
  word's edge, never inside it; every line is checked for that, and shown
  unstyled if it fails.
- **Nothing is re-wrapped**: no newline is added inside a line (the terminal
  wraps long lines itself), and leading indentation is kept.

What is removed: the delimiters that form emphasis or an inline code span,
the `#`s of an ATX heading, a `\\` escaping punctuation. A `-`/`*`/`+` bullet
shows as `•`, a `>` quote as `│`. Fences stay visible (dimmed) and the code
in them is highlighted with Pygments when the fence names a language it
knows; Pygments is imported on the first such fence, so a session that
never shows one never pays for it (and `-p` or a pipe never imports this
module at all).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# SGR codes of the inline styles
BOLD, ITALIC, UNDERLINE, DIM, CODE = "1", "3", "4", "2", "36"
_EMPHASIS = {1: frozenset({ITALIC}), 2: frozenset({BOLD}), 3: frozenset({BOLD, ITALIC})}

_FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})(.*)$")
_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_BULLET = re.compile(r"^(\s*)([-*+])([ \t]+)(.*)$")
_ORDERED = re.compile(r"^(\s*)(\d{1,9}[.)])([ \t]+)(.*)$")
_QUOTE = re.compile(r"^( {0,3})> ?(.*)$")
_RULE = re.compile(r"^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
_SGR = re.compile(r"\x1b\[[0-9;]*m")
# kept literal: URLs, and the destination of a link `[text](destination)`
_LITERAL = re.compile(r"(?:https?|ftp)://[^\s<>]+|<[a-zA-Z][a-zA-Z0-9+.-]*:[^\s<>]*>|\]\([^)\s]*\)")
_ESCAPABLE = set("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
# what may stand before an opening `*`/`_` and after a closing one (besides a space or the line's
# edge): so `/usr/*/bin/*`, `x.*y*` or `*a*/b` stay as written, while `(*a*)` and `**Reply**:` render
_BEFORE_OPEN = set("([{\"'“‘«-–—")
_AFTER_CLOSE = set(".,;:!?)]}\"'”’»-–—…")
RULE_WIDTH = 40


def _word(char: str) -> bool:
    return char.isalnum() or char == "_"


def sgr(codes: frozenset[str] | set[str], text: str) -> str:
    if not codes or not text:
        return text
    return f"\x1b[{';'.join(sorted(codes))}m{text}\x1b[0m"


def plain(text: str) -> str:
    """`text` without SGR codes."""
    return _SGR.sub("", text)


def safe(rendered: str) -> bool:
    """No style code sits between two word characters (so none splits a word)."""
    chunks = _SGR.split(rendered)  # the visible text between the codes
    before = ""
    for index, chunk in enumerate(chunks[:-1]):
        before = chunk[-1:] or before
        after = next((c[0] for c in chunks[index + 1:] if c), "")
        if before and after and _word(before) and _word(after):
            return False
    return True


# --- inline ------------------------------------------------------------------

@dataclass
class _Run:
    char: str
    length: int
    start: int  # index in the token list
    can_open: bool
    can_close: bool


def _tokens(line: str) -> list[tuple[str, Any]]:
    """("text", str) | ("code", str) | ("delim", (char, length, can_open, can_close))."""
    out: list[tuple[str, Any]] = []
    i, n = 0, len(line)
    protected = {m.start(): m.end() for m in _LITERAL.finditer(line)}
    while i < n:
        if i in protected:
            out.append(("text", line[i:protected[i]]))
            i = protected[i]
            continue
        char = line[i]
        if char == "\\" and i + 1 < n and line[i + 1] in _ESCAPABLE:
            out.append(("text", line[i + 1]))
            i += 2
            continue
        if char == "`":
            j = i
            while j < n and line[j] == "`":
                j += 1
            ticks = line[i:j]
            close = re.compile(rf"(?<!`){ticks}(?!`)").search(line, j)
            prev = line[i - 1] if i else ""
            after = line[close.end()] if close is not None and close.end() < n else ""
            if close is not None and not _word(prev) and not _word(after):
                body = line[j:close.start()]
                if len(body) > 2 and body.startswith(" ") and body.endswith(" ") and body.strip():
                    body = body[1:-1]
                out.append(("code", body))
                i = close.end()
            else:
                out.append(("text", ticks))
                i = j
            continue
        if char in "*_":
            j = i
            while j < n and line[j] == char:
                j += 1
            prev = line[i - 1] if i else ""
            after = line[j] if j < n else ""
            can_open = bool(after) and not after.isspace() and (not prev or prev.isspace() or prev in _BEFORE_OPEN)
            can_close = bool(prev) and not prev.isspace() and (not after or after.isspace() or after in _AFTER_CLOSE)
            out.append(("delim", (char, j - i, can_open, can_close)))
            i = j
            continue
        j = i + 1
        while j < n and line[j] not in "\\`*_" and j not in protected:
            j += 1
        out.append(("text", line[i:j]))
        i = j
    return out


def inline(line: str, base: frozenset[str] = frozenset()) -> str:
    """One line's inline Markdown (emphasis, code spans, escapes) as styled text; `base` styles all of it."""
    tokens = _tokens(line)
    stack: list[_Run] = []
    pairs: dict[int, tuple[int, frozenset[str]]] = {}  # opener token -> (closer token, styles)
    for index, (kind, value) in enumerate(tokens):
        if kind != "delim":
            continue
        char, length, can_open, can_close = value
        if can_close and length in _EMPHASIS:
            found = next((k for k in range(len(stack) - 1, -1, -1)
                          if stack[k].char == char and stack[k].length == length), None)
            if found is not None and char == "_" and not any(
                    k == "text" and any(c.isspace() for c in v) for k, v in tokens[stack[found].start:index]):
                found = None  # `_` pairs only around words with a space between: `__init__` is a name
            if found is not None:
                opener = stack[found]
                del stack[found:]
                pairs[opener.start] = (index, _EMPHASIS[length])
                continue
        if can_open and length in _EMPHASIS:
            stack.append(_Run(char, length, index, can_open, can_close))
    closers = {closer: styles for closer, styles in pairs.values()}
    active: list[frozenset[str]] = []
    segments: list[tuple[str, frozenset[str]]] = []

    def current() -> frozenset[str]:
        return base.union(*active) if active else base

    for index, (kind, value) in enumerate(tokens):
        if kind == "delim":
            if index in pairs:
                active.append(pairs[index][1])
            elif index in closers:
                active.remove(closers[index])
            else:
                segments.append((value[0] * value[1], current()))
        elif kind == "code":
            segments.append((value, current() | {CODE}))
        else:
            segments.append((value, current()))
    return _join(segments)


def _join(segments: list[tuple[str, frozenset[str]]]) -> str:
    out: list[str] = []
    shown: frozenset[str] = frozenset()
    for text, styles in segments:
        if not text:
            continue
        if styles != shown:
            if shown:
                out.append("\x1b[0m")
            if styles:
                out.append(f"\x1b[{';'.join(sorted(styles))}m")
            shown = styles
        out.append(text)
    if shown:
        out.append("\x1b[0m")
    return "".join(out)


# --- blocks --------------------------------------------------------------------

@dataclass
class _Fence:
    char: str
    length: int
    language: str
    lexer: Any = None
    looked_up: bool = False


def _highlight(fence: _Fence, line: str) -> str:
    if not fence.language:
        return line
    if not fence.looked_up:
        fence.looked_up = True
        try:
            from pygments.lexers import get_lexer_by_name  # type: ignore[import-untyped]
            from pygments.util import ClassNotFound  # type: ignore[import-untyped]
        except ImportError:  # rendering without highlighting is still rendering
            return line
        try:
            fence.lexer = get_lexer_by_name(fence.language, stripnl=False, ensurenl=False)
        except ClassNotFound:
            fence.lexer = None
    if fence.lexer is None or not line.strip():
        return line
    from pygments import highlight  # type: ignore[import-untyped]
    from pygments.formatters import TerminalFormatter  # type: ignore[import-untyped]

    shown = highlight(line, fence.lexer, TerminalFormatter()).rstrip("\n")
    return shown if plain(shown) == line and safe(shown) else line


class MarkdownStream:
    """Renders Markdown fed in pieces: each complete line as soon as its newline arrives.

    `feed` returns the rendered complete lines (each ending in "\\n") and
    keeps the unfinished one; `flush` renders that one too (the message
    ended) and forgets the block state, ready for the next message.
    """

    def __init__(self) -> None:
        self._pending = ""
        self._fence: _Fence | None = None

    def feed(self, text: str) -> str:
        text = self._pending + text
        if "\n" not in text:
            self._pending = text
            return ""
        done, _, self._pending = text.rpartition("\n")
        return "".join(self.render_line(line) + "\n" for line in done.split("\n"))

    def flush(self) -> str:
        rest, self._pending = self._pending, ""
        shown = self.render_line(rest) if rest else ""
        self._fence = None
        return shown

    def render_line(self, line: str) -> str:
        """One complete line (no newline), advancing the block state (inside a fence or not)."""
        shown = self._render(line)
        return shown if safe(shown) else line

    def _render(self, line: str) -> str:
        fence = self._fence
        if fence is not None:
            stripped = line.strip()
            if (stripped.startswith(fence.char * fence.length) and not stripped.strip(fence.char)
                    and len(line) - len(line.lstrip(" ")) <= 3):
                self._fence = None
                return sgr({DIM}, line)
            return _highlight(fence, line)
        if not line.strip():
            return line
        match = _FENCE.match(line)
        if match and not (match.group(2)[0] == "`" and "`" in match.group(3)):
            info = match.group(3).strip()
            self._fence = _Fence(match.group(2)[0], len(match.group(2)), info.split()[0] if info else "")
            return sgr({DIM}, line)
        if _RULE.match(line):
            return sgr({DIM}, "─" * RULE_WIDTH)
        match = _HEADING.match(line)
        if match:
            level = len(match.group(1))
            return inline(match.group(2) or "", frozenset({BOLD, UNDERLINE}) if level == 1 else frozenset({BOLD}))
        match = _QUOTE.match(line)
        if match:
            return match.group(1) + sgr({DIM}, "│") + " " + inline(match.group(2), frozenset({ITALIC}))
        match = _BULLET.match(line)
        if match:
            indent, _, gap, rest = match.groups()
            return f"{indent}•{gap}{inline(rest)}"
        match = _ORDERED.match(line)
        if match:
            indent, marker, gap, rest = match.groups()
            return f"{indent}{marker}{gap}{inline(rest)}"
        if _TABLE_RULE.match(line) and "|" in line:
            return sgr({DIM}, line)
        return inline(line)


def render(text: str) -> str:
    """A whole message (a transcript's): every line rendered, no newline added."""
    stream = MarkdownStream()
    return "\n".join(stream.render_line(line) for line in text.split("\n"))
