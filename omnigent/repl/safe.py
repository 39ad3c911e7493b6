"""Text from the model, tools or the store, made safe to print on a terminal.

A file a tool read, a command's output or a model's answer may hold control
characters: an ESC sequence can move the cursor, rewrite the title, recolour
or hide what follows, a C1 CSI (U+009B) does the same in one character, a CR
returns to the start of the line so later text overprints earlier text, BEL
rings. `neutralise` keeps `\\n` and `\\t` and turns every other control
character into something visible and inert:

- C0 (U+0000-U+001F) and DEL (U+007F) become caret notation: ESC is `^[`,
  BEL `^G`, CR `^M`, DEL `^?` (a CRLF line end is first read as a plain LF,
  so text from Windows files does not end every line in `^M`);
- C1 (U+0080-U+009F) become U+FFFD (`�`): they have no caret form, and a
  terminal that reads UTF-8 treats some of them as ESC + a letter.

Everything printed that did not come from omnigent itself goes through
here before styling is added, so the only escape sequences the terminal sees
are omnigent's own (its SGR styling and the prompt redraw).
"""

from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
REPLACEMENT = "\ufffd"


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return "^" + chr(code + 0x40)
    if code == 0x7F:
        return "^?"
    return REPLACEMENT


def neutralise(text: str) -> str:
    """`text` with every control character but `\\n` and `\\t` made visible (see module doc)."""
    if not isinstance(text, str):
        text = str(text)
    if "\r\n" in text:
        text = text.replace("\r\n", "\n")
    return _CONTROL.sub(_visible, text)
