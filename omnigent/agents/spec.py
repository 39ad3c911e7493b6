"""Agent specs: check and normalise the YAML that defines an agent.

Every command starts from an agent YAML (a file, a directory with
`config.yaml`, or a .tar.gz bundle; finding and reading it is `load.py`'s
part). This module turns the parsed document into one immutable
`AgentSpec`. Errors are `SpecError`s whose text is one line naming the file and
the field, so the CLI can print them unchanged.

Files are strict: every key must be one of `keys.KEYS` (the one list of what an
agent file may say), and a typo is an error naming the nearest valid key.
That holds for what comes in from now on (the CLI's files, clients'
uploads); specs stored by earlier releases are read leniently by
`AgentSpec.from_dict`, their unknown keys ignored and logged once.

What an agent may do (`tools`, `permissions`, `max_steps`, `tool_timeout`)
is part of its spec too; `actions.py` checks those keys.

Credentials stay as written: `${VAR}` references in `executor.auth` are checked
but not expanded here, so values from the environment never reach the store or
an upload (ARCHITECTURE.md, "Security"). `resolve_auth` expands them in the
process that calls the model.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import yaml

from . import actions
from .actions import DEFAULT_MAX_STEPS, DEFAULT_PERMISSIONS, DEFAULT_TOOL_TIMEOUT
from .keys import unknown_keys

HARNESSES = ("openai-agents", "openai-chat")
DEFAULT_HARNESS = "openai-agents"
# Filled in only for specs stored by earlier releases that named neither
# harness nor model; a file without a model is an error unless --model is given.
DEFAULT_MODEL = "gpt-4o-mini"
AUTH_TYPES = ("api_key",)


MAX_BYTES = 16 * 1024 * 1024  # one spec file, and a whole unpacked bundle

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_PROMPT_KEYS = ("prompt", "instructions")
_ENV_FALLBACK = {"api_key": "OPENAI_API_KEY", "base_url": "OPENAI_BASE_URL"}
_MAX_VALUES = 100_000  # counts alias reuse too: stops "billion laughs" documents
_MAX_DEPTH = 64


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


@dataclass(frozen=True)
class AgentSpec:
    """One agent, overrides applied. Treat `auth` and `raw` as read-only.

    `auth` is `{"type", "api_key", "base_url"}` as written (unexpanded), or
    None. `raw` is the effective YAML document: the file's mapping with the
    overrides and the defaulted harness/model written in; unknown keys kept.
    `source` names where it came from and takes no part in equality.
    `tools`, `permissions`, `max_steps` and `tool_timeouts` (`{name: seconds}`,
    always with "default") say what the agent may do.
    """

    name: str
    instructions: str
    harness: str
    model: str | None
    auth: dict | None = field(hash=False)
    reasoning_effort: str | None
    source: str = field(compare=False)
    raw: dict = field(hash=False)
    tools: tuple[str, ...] = ()
    permissions: str = DEFAULT_PERMISSIONS
    max_steps: int = DEFAULT_MAX_STEPS
    tool_timeouts: dict = field(default_factory=lambda: {"default": DEFAULT_TOOL_TIMEOUT}, hash=False)

    def to_dict(self) -> dict:
        """JSON-able form sent to runners; `from_dict` reverses it (without `source`)."""
        return {
            "name": self.name,
            "instructions": self.instructions,
            "harness": self.harness,
            "model": self.model,
            "auth": _clone(self.auth),
            "reasoning_effort": self.reasoning_effort,
            "tools": list(self.tools),
            "permissions": self.permissions,
            "max_steps": self.max_steps,
            "tool_timeouts": dict(self.tool_timeouts),
            "raw": _clone(self.raw),
        }

    @classmethod
    def from_dict(cls, d: dict, *, source: str = "agent spec") -> AgentSpec:
        """Rebuild from `to_dict` output, as stored by this or an earlier release.

        `raw` is checked again like a file (stored data is not trusted) but
        leniently: unknown keys are kept, ignored and logged once, and a
        missing model is filled in as earlier releases did, so specs and
        conversations stored before strict files keep working."""
        if not isinstance(d, dict):
            raise SpecError(source, f"expected a mapping, got {_kind(d)}")
        if "raw" not in d:
            raise SpecError(source, "'raw' is missing")
        return build_spec(d["raw"], source, strict=False)


def resolve_auth(spec: AgentSpec, environ=None) -> dict:
    """`{"api_key", "base_url"}` to call the model with; values may be None.

    Each comes from `executor.auth` with `${VAR}` expanded from `environ`
    (default `os.environ`), else from OPENAI_API_KEY / OPENAI_BASE_URL.
    A `${VAR}` that is not set raises SpecError.
    """
    env = os.environ if environ is None else environ
    label = spec.source or spec.name
    auth = spec.auth or {}
    out = {}
    for key, fallback in _ENV_FALLBACK.items():
        value = auth.get(key)
        if value is not None:
            value = _expand(value, env, label, f"executor.auth.{key}")
        out[key] = value or env.get(fallback) or None
    return out


# --- building ---------------------------------------------------------------


def build_spec(
    doc: object,
    source: str,
    *,
    model: str | None = None,
    harness: str | None = None,
    system_prompt: str | None = None,
    strict: bool = True,
) -> AgentSpec:
    """Check a parsed document, apply overrides, return the spec (shared by all loaders).

    `strict` (files and uploads): an unknown key or a missing model is a
    SpecError. Not strict (stored specs): unknown keys are logged once and
    kept, and a spec with neither harness nor model gets DEFAULT_MODEL."""
    if doc is None:
        raise SpecError(source, "empty: expected a mapping with 'name' and 'prompt'")
    if not isinstance(doc, dict):
        raise SpecError(source, f"top level must be a mapping, got {_kind(doc)}")
    doc = _copy_plain(doc, source)
    for where, suggestion in unknown_keys(doc, source, strict=strict):
        raise SpecError(source, f"unknown key ({suggestion})", where)

    description = doc.get("description")
    if description is not None and not isinstance(description, str):
        raise SpecError(source, f"must be a string, got {_kind(description)}", "description")

    if "name" not in doc:
        raise SpecError(source, "'name' is missing")
    name = doc["name"]
    if not isinstance(name, str):
        raise SpecError(source, f"must be a string, got {_kind(name)}", "name")
    if not _NAME_RE.fullmatch(name) or name in (".", ".."):
        raise SpecError(source, f"may only hold letters, digits, '_', '.' and '-' (got {name!r})", "name")

    present = [k for k in _PROMPT_KEYS if k in doc]
    if len(present) > 1:
        raise SpecError(source, "'prompt' and 'instructions' are both given; keep one")
    prompt_key = present[0] if present else "prompt"
    if system_prompt is not None:
        if not isinstance(system_prompt, str):
            raise SpecError(source, f"must be a string, got {_kind(system_prompt)}", "--system-prompt")
        instructions = system_prompt
    elif not present:
        raise SpecError(source, "'prompt' (or 'instructions') is missing")
    else:
        instructions = doc[prompt_key]
        if not isinstance(instructions, str):
            raise SpecError(source, f"must be a string, got {_kind(instructions)}", prompt_key)

    executor = doc.get("executor")
    if executor is None:
        executor = {}
    elif not isinstance(executor, dict):
        raise SpecError(source, f"must be a mapping, got {_kind(executor)}", "executor")
    eff_harness = executor.get("harness")
    if eff_harness is not None:
        eff_harness = _harness(eff_harness, source, "executor.harness")
    if harness is not None:
        eff_harness = _harness(harness, source, "--harness")
    eff_model = executor.get("model")
    if eff_model is not None:
        _nonempty(eff_model, source, "executor.model")
    if model is not None:
        eff_model = _nonempty(model, source, "--model")
    effort = _effort(doc, executor, source)
    auth = _auth(executor.get("auth"), source)
    try:
        may = actions.read(doc, executor, source, strict=strict)
    except actions.Bad as exc:
        raise SpecError(source, exc.problem, exc.where) from None
    if eff_model is None:
        if strict:
            raise SpecError(source, "'executor.model' is missing (name the model to use, or pass --model)")
        if eff_harness is None:
            eff_model = DEFAULT_MODEL
    eff_harness = eff_harness or DEFAULT_HARNESS

    # raw: the effective document, so reloading it gives this same spec
    raw = dict(doc)
    raw[prompt_key] = instructions
    executor = dict(executor)
    executor["harness"] = eff_harness
    if eff_model is not None:
        executor["model"] = eff_model
    raw["executor"] = executor
    return AgentSpec(
        name=name,
        instructions=instructions,
        harness=eff_harness,
        model=eff_model,
        auth=auth,
        reasoning_effort=effort,
        source=source,
        raw=raw,
        tools=may.tools,
        permissions=may.permissions,
        max_steps=may.max_steps,
        tool_timeouts=may.tool_timeouts,
    )


def _effort(doc: dict, executor: dict, source: str) -> str | None:
    top, inner = doc.get("reasoning_effort"), executor.get("reasoning_effort")
    if top is not None:
        _nonempty(top, source, "reasoning_effort")
    if inner is not None:
        _nonempty(inner, source, "executor.reasoning_effort")
    if top is not None and inner is not None and top != inner:
        raise SpecError(source, f"'reasoning_effort' ({top!r}) and 'executor.reasoning_effort' ({inner!r}) "
                                "disagree; keep one")
    return top if top is not None else inner


def _harness(value: object, source: str, where: str) -> str:
    if not isinstance(value, str):
        raise SpecError(source, f"must be a string, got {_kind(value)}", where)
    canonical = value.strip().lower().replace("_", "-")
    if canonical not in HARNESSES:
        raise SpecError(source, f"unknown harness {value!r} (known: {', '.join(HARNESSES)})", where)
    return canonical


def _nonempty(value: object, source: str, where: str) -> str:
    if not isinstance(value, str):
        raise SpecError(source, f"must be a string, got {_kind(value)}", where)
    if not value.strip():
        raise SpecError(source, "must not be empty", where)
    return value


def _auth(auth: object, source: str) -> dict | None:
    if auth is None:
        return None
    if not isinstance(auth, dict):
        raise SpecError(source, f"must be a mapping, got {_kind(auth)}", "executor.auth")
    kind = auth.get("type")
    if kind is None:
        kind = "api_key"
    elif kind not in AUTH_TYPES:
        raise SpecError(source, f"unknown auth type {kind!r} (known: {', '.join(AUTH_TYPES)})", "executor.auth.type")
    out = {"type": kind}
    for key in ("api_key", "base_url"):
        value = auth.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise SpecError(source, f"must be a string, got {_kind(value)}", f"executor.auth.{key}")
            _check_refs(value, source, f"executor.auth.{key}")
        out[key] = value
    return out


def _check_refs(value: str, source: str, where: str) -> None:
    """Every `${` must start a well-formed `${NAME}`; `$NAME` stays literal."""
    for m in re.finditer(r"\$\{", value):
        if not _VAR_RE.match(value, m.start()):
            end = value.find("}", m.start())
            ref = value[m.start() : end + 1 if end != -1 else len(value)][:40]
            raise SpecError(source, f"bad variable reference {ref!r} (write ${{NAME}})", where)


def _expand(value: str, env, source: str, where: str) -> str:
    _check_refs(value, source, where)

    def sub(m: re.Match) -> str:
        var = m.group(1)
        if var not in env:
            raise SpecError(source, f"environment variable {var!r} is not set", where)
        return env[var]

    return _VAR_RE.sub(sub, value)


# --- YAML and documents -----------------------------------------------------

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
    return isinstance(doc, dict) and "name" in doc and any(k in doc for k in _PROMPT_KEYS)


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


def _copy_plain(doc: dict, source: str) -> dict:
    """Deep copy that admits only JSON types (string keys), bounded in size and depth."""
    count = 0

    def walk(value, where: str, depth: int):
        nonlocal count
        count += 1
        if count > _MAX_VALUES:
            raise SpecError(source, f"too large (over {_MAX_VALUES} values once aliases are expanded)")
        if depth > _MAX_DEPTH:
            raise SpecError(source, f"nested deeper than {_MAX_DEPTH} levels", where.split("[")[0] or None)
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


def _clone(value):
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clone(v) for v in value]
    return value


def _kind(value: object) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "a boolean"
    for types, text in ((dict, "a mapping"), (list, "a list"), (str, "a string"), (int, "an integer"), (float, "a number")):
        if isinstance(value, types):
            return text
    return type(value).__name__
