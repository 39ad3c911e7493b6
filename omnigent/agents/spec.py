"""Agent specs: check and normalise the YAML that defines an agent.

Every command starts from an agent YAML (a file, a directory with
`config.yaml`, or a .tar.gz bundle; finding and reading it is `load.py`'s
part, parsing it `documents.py`'s). This module turns the parsed document
into one immutable `AgentSpec`. Errors are `SpecError`s (`errors.py`) whose
text is one line naming the file and the field, so the CLI can print them
unchanged.

Files are strict: every key must be one of `keys.KEYS` (the one list of what an
agent file may say), and a typo is an error naming the nearest valid key.
That holds for what comes in from now on (the CLI's files, clients'
uploads); specs stored by earlier releases are read leniently by
`AgentSpec.from_dict`, their unknown keys ignored and logged once.

What an agent may do (`tools`, `permissions`, `max_steps`, `tool_timeout`)
is part of its spec too; `actions.py` checks those keys.

Credentials stay as written: `${VAR}` references in `executor.auth` are checked
but not expanded here, so values from the environment never reach the store or
an upload (ARCHITECTURE.md, "Security"). `resolve_auth` (`auth.py`) expands
them in the process that calls the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from . import actions
from .actions import DEFAULT_MAX_STEPS, DEFAULT_PERMISSIONS, DEFAULT_TOOL_TIMEOUT
from .auth import check_auth
from .documents import MAX_BYTES, PROMPT_KEYS, clone, copy_plain  # noqa: F401  (MAX_BYTES: its home before)
from .errors import SpecError, kind_of
from .keys import unknown_keys

HARNESSES = ("openai-agents", "openai-chat")
DEFAULT_HARNESS = "openai-agents"
# Filled in only for specs stored by earlier releases that named neither
# harness nor model; a file without a model is an error unless --model is given.
DEFAULT_MODEL = "gpt-4o-mini"

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")


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
            "auth": clone(self.auth),
            "reasoning_effort": self.reasoning_effort,
            "tools": list(self.tools),
            "permissions": self.permissions,
            "max_steps": self.max_steps,
            "tool_timeouts": dict(self.tool_timeouts),
            "raw": clone(self.raw),
        }

    @classmethod
    def from_dict(cls, d: dict, *, source: str = "agent spec") -> AgentSpec:
        """Rebuild from `to_dict` output, as stored by this or an earlier release.

        `raw` is checked again like a file (stored data is not trusted) but
        leniently: unknown keys are kept, ignored and logged once, and a
        missing model is filled in as earlier releases did, so specs and
        conversations stored before strict files keep working."""
        if not isinstance(d, dict):
            raise SpecError(source, f"expected a mapping, got {kind_of(d)}")
        if "raw" not in d:
            raise SpecError(source, "'raw' is missing")
        return build_spec(d["raw"], source, strict=False)


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
        raise SpecError(source, f"top level must be a mapping, got {kind_of(doc)}")
    doc = copy_plain(doc, source)
    for where, suggestion in unknown_keys(doc, source, strict=strict):
        raise SpecError(source, f"unknown key ({suggestion})", where)

    description = doc.get("description")
    if description is not None and not isinstance(description, str):
        raise SpecError(source, f"must be a string, got {kind_of(description)}", "description")

    if "name" not in doc:
        raise SpecError(source, "'name' is missing")
    name = doc["name"]
    if not isinstance(name, str):
        raise SpecError(source, f"must be a string, got {kind_of(name)}", "name")
    if not _NAME_RE.fullmatch(name) or name in (".", ".."):
        raise SpecError(source, f"may only hold letters, digits, '_', '.' and '-' (got {name!r})", "name")

    present = [k for k in PROMPT_KEYS if k in doc]
    if len(present) > 1:
        raise SpecError(source, "'prompt' and 'instructions' are both given; keep one")
    prompt_key = present[0] if present else "prompt"
    if system_prompt is not None:
        if not isinstance(system_prompt, str):
            raise SpecError(source, f"must be a string, got {kind_of(system_prompt)}", "--system-prompt")
        instructions = system_prompt
    elif not present:
        raise SpecError(source, "'prompt' (or 'instructions') is missing")
    else:
        instructions = doc[prompt_key]
        if not isinstance(instructions, str):
            raise SpecError(source, f"must be a string, got {kind_of(instructions)}", prompt_key)

    executor = doc.get("executor")
    if executor is None:
        executor = {}
    elif not isinstance(executor, dict):
        raise SpecError(source, f"must be a mapping, got {kind_of(executor)}", "executor")
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
    auth = check_auth(executor.get("auth"), source)
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
        raise SpecError(source, f"must be a string, got {kind_of(value)}", where)
    canonical = value.strip().lower().replace("_", "-")
    if canonical not in HARNESSES:
        raise SpecError(source, f"unknown harness {value!r} (known: {', '.join(HARNESSES)})", where)
    return canonical


def _nonempty(value: object, source: str, where: str) -> str:
    if not isinstance(value, str):
        raise SpecError(source, f"must be a string, got {kind_of(value)}", where)
    if not value.strip():
        raise SpecError(source, "must not be empty", where)
    return value
