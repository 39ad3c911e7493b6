"""What an agent may do: the `tools`, `permissions`, `max_steps` and `tool_timeout` keys of its spec.

Each key may sit at the top level or under `executor:` (both is fine when
they agree). `tools` names built-in tools among `TOOL_NAMES` (none by
default), `permissions` is ask | auto | deny (default ask), `max_steps` the
model steps per turn (default 50), `tool_timeout` seconds for every tool or a
mapping `{default: 120, shell: 300}`; `tool_timeouts` always holds "default".

A file or an upload (strict) is refused over any bad value, in one line
naming the field (`Bad`, turned into a SpecError by spec.py). A spec stored
by another release (not strict) keeps loading: its unknown tools are
dropped, a bad value gives the default (the safe one), each logged once.

The tool names are omnigent.tools.policy's (pure and light: loading a spec
loads none of the tools themselves).
"""

from __future__ import annotations

import difflib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from omnigent.tools.policy import TOOL_NAMES

from .errors import kind_of

PERMISSIONS = ("ask", "auto", "deny")
DEFAULT_PERMISSIONS = "ask"
DEFAULT_MAX_STEPS = 50
DEFAULT_TOOL_TIMEOUT = 120
_MAX_STEPS_BOUND = 10_000
_MAX_TIMEOUT = 24 * 3600.0

_T = TypeVar("_T")
_log = logging.getLogger("omnigent.agents")
_logged: set[tuple[str, str]] = set()


class Bad(Exception):
    """A bad value: the problem, and the dotted field it is in."""

    def __init__(self, problem: str, where: str | None = None) -> None:
        super().__init__(problem)
        self.problem, self.where = problem, where


@dataclass(frozen=True)
class Actions:
    tools: tuple[str, ...] = ()
    permissions: str = DEFAULT_PERMISSIONS
    max_steps: int = DEFAULT_MAX_STEPS
    tool_timeouts: dict = field(default_factory=lambda: {"default": DEFAULT_TOOL_TIMEOUT})


def read(doc: dict, executor: dict, source: str, *, strict: bool) -> Actions:
    """The four keys of `doc` (and its `executor` mapping), checked; raises Bad when strict."""
    return Actions(
        tools=_lenient(strict, source, lambda: _tools(doc, executor, source, strict), ()),
        permissions=_lenient(strict, source, lambda: _permissions(doc, executor), DEFAULT_PERMISSIONS),
        max_steps=_lenient(strict, source, lambda: _max_steps(doc, executor), DEFAULT_MAX_STEPS),
        tool_timeouts=_lenient(strict, source, lambda: _tool_timeouts(doc, executor),
                               {"default": DEFAULT_TOOL_TIMEOUT}),
    )


def _either(doc: dict, executor: dict, key: str,
            check: Callable[[object, str], _T]) -> tuple[_T | None, str | None]:
    """A key that may sit at the top level or under `executor:`: its checked value and where it was.

    Both given is fine when they agree (an effective document written back
    may hold both), an error otherwise."""
    found = [(where, check(value, where)) for where, value in ((key, doc.get(key)),
             (f"executor.{key}", executor.get(key))) if value is not None]
    if len(found) == 2 and found[0][1] != found[1][1]:
        raise Bad(f"{key!r} and 'executor.{key}' disagree; keep one")
    if not found:
        return None, None
    where, value = found[0]
    return value, where


def _tools(doc: dict, executor: dict, source: str, strict: bool) -> tuple[str, ...]:
    """The tools named, checked against TOOL_NAMES; a stored spec's unknown ones are dropped (logged once)."""

    def check(value: object, where: str) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise Bad(f"must be a list of tool names (known: {', '.join(TOOL_NAMES)}), "
                                    f"got {kind_of(value)}", where)
        names: list[str] = []
        for i, name in enumerate(value):
            if not isinstance(name, str) or name not in TOOL_NAMES:
                if not strict:
                    _log_dropped_tool(source, f"{where}[{i}]", name)
                    continue
                if not isinstance(name, str):
                    raise Bad(f"must be a tool name, got {kind_of(name)}", f"{where}[{i}]")
                near = difflib.get_close_matches(name, TOOL_NAMES, n=1, cutoff=0.6)
                hint = f"did you mean {near[0]!r}? " if near else ""
                raise Bad(f"unknown tool {name!r} ({hint}known: {', '.join(TOOL_NAMES)})",
                                f"{where}[{i}]")
            if name in names:
                if strict:
                    raise Bad(f"{name!r} is listed twice", f"{where}[{i}]")
                continue
            names.append(name)
        return tuple(names)

    value, _ = _either(doc, executor, "tools", check)
    return value or ()


def _lenient(strict: bool, source: str, read_value, default):
    """`read_value()`; for a stored spec (not strict) a bad value is logged once and the default used,
    so a spec stored by another release keeps serving turns (with the safe defaults)."""
    if strict:
        return read_value()
    try:
        return read_value()
    except Bad as exc:
        _log_once(source, exc.where or "", f"{exc.problem}; the default is used (stored by another release)")
        return default


def _log_dropped_tool(source: str, where: str, name: object) -> None:
    _log_once(source, f"{where}", f"unknown tool {name!r}, ignored (stored by another release)")


def _log_once(source: str, where: str, text: str) -> None:
    key = (source, f"{where}: {text}")
    if key not in _logged:
        _logged.add(key)
        _log.warning("%s: %s%s", source, f"{where}: " if where else "", text)


def _permissions(doc: dict, executor: dict) -> str:
    def check(value: object, where: str) -> str:
        if not isinstance(value, str):
            raise Bad(f"must be one of {', '.join(PERMISSIONS)}, got {kind_of(value)}", where)
        mode = value.strip().lower()
        if mode not in PERMISSIONS:
            raise Bad(f"unknown permission mode {value!r} (known: {', '.join(PERMISSIONS)})", where)
        return mode

    value, _ = _either(doc, executor, "permissions", check)
    return value or DEFAULT_PERMISSIONS


def _max_steps(doc: dict, executor: dict) -> int:
    def check(value: object, where: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise Bad(f"must be a whole number of model steps, got {kind_of(value)}", where)
        if not 1 <= value <= _MAX_STEPS_BOUND:
            raise Bad(f"must be between 1 and {_MAX_STEPS_BOUND} (got {value})", where)
        return value

    value, _ = _either(doc, executor, "max_steps", check)
    return DEFAULT_MAX_STEPS if value is None else value


def _tool_timeouts(doc: dict, executor: dict) -> dict:
    """`{name: seconds}` with "default" always there: from a number (the default) or a mapping."""

    def seconds(value: object, where: str) -> int | float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise Bad(f"must be a number of seconds, got {kind_of(value)}", where)
        if not (math.isfinite(value) and 0 < value <= _MAX_TIMEOUT):
            raise Bad(f"must be more than 0 and at most {_MAX_TIMEOUT:.0f} seconds (got {value})",
                            where)
        return value

    def check(value: object, where: str) -> dict:
        if not isinstance(value, dict):
            return {"default": seconds(value, where)}
        out: dict[str, int | float] = {"default": DEFAULT_TOOL_TIMEOUT}
        for key, v in value.items():
            if key != "default" and key not in TOOL_NAMES:
                near = difflib.get_close_matches(key, ("default",) + TOOL_NAMES, n=1, cutoff=0.6)
                hint = f"did you mean {near[0]!r}? " if near else ""
                raise Bad(f"unknown key ({hint}known: default, {', '.join(TOOL_NAMES)})",
                                f"{where}.{key}")
            out[key] = seconds(v, f"{where}.{key}")
        return out

    value, _ = _either(doc, executor, "tool_timeout", check)
    return value or {"default": DEFAULT_TOOL_TIMEOUT}
