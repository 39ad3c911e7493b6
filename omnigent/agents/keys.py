"""The one list of keys an agent file may hold, and the check of a document against it.

Strict for what comes in from now on (files the CLI reads, bundles clients
upload): a key not listed is an error naming the nearest valid key, so a
typo such as `modle:` is caught instead of sending an empty model. Specs
stored by earlier releases are checked leniently: their unknown keys are
logged once and otherwise ignored.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterator

# Every key an agent file may hold, in one place: a nested mapping is a
# section, None a value checked where it is read. Adding a key is one line.
KEYS: dict = {
    "name": None,
    "description": None,
    "prompt": None,
    "instructions": None,
    "reasoning_effort": None,
    # what the agent may do (spec.py checks the values); each may also sit under executor
    "tools": None,
    "permissions": None,
    "max_steps": None,
    "tool_timeout": None,
    "executor": {
        "harness": None,
        "model": None,
        "reasoning_effort": None,  # where earlier releases read it; same meaning as the top-level key
        "auth": {"type": None, "api_key": None, "base_url": None},
        "tools": None,
        "permissions": None,
        "max_steps": None,
        "tool_timeout": None,
    },
}

_log = logging.getLogger("omnigent.agents")
_logged_unknown: set[tuple[str, str]] = set()


def unknown_keys(doc: dict, source: str, *, strict: bool) -> Iterator[tuple[str, str]]:
    """(dotted key, "did you mean ...?") for every key of `doc` not in KEYS when
    `strict`; otherwise each is logged once per source and key, and none is yielded."""
    for where, key, valid in _unknown_keys(doc, KEYS, ""):
        if strict:
            yield where, _suggest(key, valid)
        elif (source, where) not in _logged_unknown:
            _logged_unknown.add((source, where))
            _log.warning("%s: %s: unknown key, ignored (stored before agent files were strict)", source, where)


def _unknown_keys(doc: dict, schema: dict, prefix: str):
    for key, value in doc.items():
        where = f"{prefix}.{key}" if prefix else key
        if key not in schema:
            yield where, key, schema
        elif isinstance(schema[key], dict) and isinstance(value, dict):
            yield from _unknown_keys(value, schema[key], where)


def _suggest(key: str, siblings: dict) -> str:
    """'did you mean ...?' for the nearest valid key: a sibling, else the same key elsewhere."""
    near = difflib.get_close_matches(key, list(siblings), n=1, cutoff=0.6)
    if near:
        return f"did you mean {near[0]!r}?"
    paths = dict(_paths(KEYS, ""))
    elsewhere = [p for p, leaf in paths.items() if leaf == key] or [
        p for p, leaf in paths.items() if difflib.get_close_matches(key, [leaf], n=1, cutoff=0.75)]
    if elsewhere:
        return f"did you mean {elsewhere[0]!r}?"
    return f"known: {', '.join(siblings)}"


def _paths(schema: dict, prefix: str):
    for key, sub in schema.items():
        path = f"{prefix}.{key}" if prefix else key
        yield path, key
        if isinstance(sub, dict):
            yield from _paths(sub, path)
