"""The one error of agent specs: a `SpecError`, one line naming the file and the field.

Every part of reading an agent (the YAML, the document, the spec, its
credentials, a bundle) raises it, so the CLI can print it unchanged and the
server can answer it as a 400. `kind_of` names what was found instead of
what was expected, the same way in every message.
"""

from __future__ import annotations

import re


class SpecError(Exception):
    """An agent spec that cannot be used: `<file>: [<field>: ]<problem>`, one line."""

    def __init__(self, source: str, problem: str, field: str | None = None) -> None:
        self.source = str(source)
        self.problem = problem
        self.field = field
        text = f"{self.source}: {field}: {problem}" if field else f"{self.source}: {problem}"
        super().__init__(re.sub(r"\s*[\r\n]+\s*", " ", text).strip())

    def __reduce__(self):  # picklable despite the extra arguments
        return (SpecError, (self.source, self.problem, self.field))


def kind_of(value: object) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "a boolean"
    for types, text in ((dict, "a mapping"), (list, "a list"), (str, "a string"), (int, "an integer"), (float, "a number")):
        if isinstance(value, types):
            return text
    return type(value).__name__
