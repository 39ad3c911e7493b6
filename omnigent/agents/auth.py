"""An agent's credentials: checked as written, expanded only where the model is called.

`${VAR}` references in `executor.auth` are checked when a spec is built
(`check_auth`) but not expanded there, so values from the environment never
reach the store or an upload (ARCHITECTURE.md, "Security"). `resolve_auth`
expands them in the process that calls the model, falling back to
OPENAI_API_KEY / OPENAI_BASE_URL.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from .errors import SpecError, kind_of

if TYPE_CHECKING:
    from .spec import AgentSpec

AUTH_TYPES = ("api_key",)

_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_ENV_FALLBACK = {"api_key": "OPENAI_API_KEY", "base_url": "OPENAI_BASE_URL"}


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


def check_auth(auth: object, source: str) -> dict | None:
    if auth is None:
        return None
    if not isinstance(auth, dict):
        raise SpecError(source, f"must be a mapping, got {kind_of(auth)}", "executor.auth")
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
                raise SpecError(source, f"must be a string, got {kind_of(value)}", f"executor.auth.{key}")
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
