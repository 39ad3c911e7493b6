"""Agent documents: YAML in and out, bounded, and how a spec is found among files.

What comes in is untrusted (a client's upload, a stored spec): parsing keeps
dates as strings and every value a JSON type, so every spec is JSON-able;
`copy_plain` bounds a document's size (aliases expanded) and depth, and
`read_capped` a file's, before anything looks at them. A directory or
bundle holds its spec in `config.yaml`, else in its one root YAML file, else
in the one that looks like an agent (`select_document`). What the document
means is `spec.py`'s part.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import yaml

from .errors import SpecError

MAX_BYTES = 16 * 1024 * 1024  # one spec file, and a whole unpacked bundle

PROMPT_KEYS = ("prompt", "instructions")
_MAX_VALUES = 100_000  # counts alias reuse too: stops "billion laughs" documents
MAX_DEPTH = 64


if TYPE_CHECKING:  # the C classes when libyaml is there; the same interface either way
    _BaseLoader = yaml.SafeLoader
    _BaseDumper = yaml.SafeDumper
else:
    _BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    _BaseDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _Loader(_BaseLoader):
    """Safe loader that keeps dates as strings, so every spec is JSON-able."""


_Loader.yaml_implicit_resolvers = {
    first: [r for r in resolvers if r[0] != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in _BaseLoader.yaml_implicit_resolvers.items()
}


class _Dumper(_BaseDumper):
    """Safe dumper writing multi-line strings as `|` blocks (prompts stay readable)."""


def _represent_str(dumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def parse_yaml(data: bytes, source: str) -> object:
    """Parse one YAML document; any failure becomes a one-line SpecError."""
    try:
        return yaml.load(data, Loader=_Loader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise SpecError(source, f"not valid YAML ({where}{e.problem or e.context})") from e
    except yaml.YAMLError as e:
        raise SpecError(source, f"not valid YAML ({e})") from e
    except RecursionError as e:
        raise SpecError(source, "not valid YAML (nested too deeply)") from e


def dump_yaml(doc: dict) -> bytes:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True).encode("utf-8")


def looks_like_agent(doc: object) -> bool:
    """A mapping with `name` and a prompt key: how a root YAML is recognised."""
    return isinstance(doc, dict) and "name" in doc and any(k in doc for k in PROMPT_KEYS)


def select_document(label: str, names: list[str], read, label_of) -> tuple[object, str]:
    """Pick the spec among the root files `names` of a directory or bundle.

    `config.yaml` if present; else the only root .yaml/.yml; else the only one
    that looks like an agent. Returns (parsed document, source label).
    """
    if "config.yaml" in names:
        source = label_of("config.yaml")
        return parse_yaml(read("config.yaml"), source), source
    candidates = sorted(n for n in names if n.lower().endswith((".yaml", ".yml")) and not n.startswith("."))
    if not candidates:
        raise SpecError(label, "no config.yaml and no .yaml/.yml file at its root")
    if len(candidates) == 1:
        source = label_of(candidates[0])
        return parse_yaml(read(candidates[0]), source), source
    found = []
    for n in candidates:
        try:
            doc = parse_yaml(read(n), label_of(n))
        except SpecError:
            continue
        if looks_like_agent(doc):
            found.append((doc, label_of(n)))
    if len(found) == 1:
        return found[0]
    listed = ", ".join(candidates)
    if not found:
        raise SpecError(label, f"no config.yaml, and none of {listed} has 'name' and 'prompt'")
    raise SpecError(label, f"no config.yaml, and several root files look like agents ({listed})")


def read_capped(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise SpecError(path, "no such file") from None
    except OSError as e:
        raise SpecError(path, f"cannot read ({e.strerror or e})") from e
    if len(data) > MAX_BYTES:
        raise SpecError(path, f"too large (over {MAX_BYTES // (1024 * 1024)} MiB)")
    return data


def copy_plain(doc: dict, source: str) -> dict:
    """Deep copy that admits only JSON types (string keys), bounded in size and depth."""
    count = 0

    def walk(value, where: str, depth: int):
        nonlocal count
        count += 1
        if count > _MAX_VALUES:
            raise SpecError(source, f"too large (over {_MAX_VALUES} values once aliases are expanded)")
        if depth > MAX_DEPTH:
            raise SpecError(source, f"nested deeper than {MAX_DEPTH} levels", where.split("[")[0] or None)
        if value is None or isinstance(value, (str, bool, int, float)):
            return value
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                if not isinstance(k, str):
                    raise SpecError(source, f"keys must be strings, got {k!r}", where or None)
                out[k] = walk(v, f"{where}.{k}" if where else k, depth + 1)
            return out
        if isinstance(value, list):
            return [walk(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
        raise SpecError(source, f"unsupported YAML value of type {type(value).__name__}", where or None)

    return walk(doc, "", 0)


def clone(value):
    if isinstance(value, dict):
        return {k: clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clone(v) for v in value]
    return value
