"""Which API key and base URL a turn calls the model with.

Credentials never travel through the store (ARCHITECTURE.md, "Security"): the
agent dict a turn carries names them as `${VAR}` references in `auth`, and
they are expanded here, in the process that calls the model, from its own
environment, with OPENAI_API_KEY / OPENAI_BASE_URL as the fallback.

Private on purpose: `omnigent.agents.auth.resolve_auth` takes an `AgentSpec`
(and imports yaml), while a runner only holds the plain dict of a TurnStart.
The rules are the same: a `${VAR}` that is not set is an error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_ENV_FALLBACK = {"api_key": "OPENAI_API_KEY", "base_url": "OPENAI_BASE_URL"}

HOW_TO = (
    "set OPENAI_API_KEY (and OPENAI_BASE_URL for an OpenAI-compatible endpoint) "
    "in the environment that starts omnigent, or executor.auth.api_key in the agent spec"
)


class MissingCredentials(Exception):
    """No usable API key; the message says how to provide one (one line)."""


def resolve(agent: Mapping[str, Any], environ: Mapping[str, str]) -> tuple[str, str | None]:
    """(api_key, base_url) for this agent; base_url None means the SDK default."""
    auth = agent.get("auth") or {}
    if not isinstance(auth, Mapping):
        raise MissingCredentials(f"agent auth must be a mapping; {HOW_TO}")
    values: dict[str, str | None] = {}
    for key, fallback in _ENV_FALLBACK.items():
        raw = auth.get(key)
        value = _expand(raw, environ, key) if raw is not None else None
        values[key] = value or environ.get(fallback) or None
    if not values["api_key"]:
        raise MissingCredentials(f"no API key for the model: {HOW_TO}")
    return values["api_key"], values["base_url"]


def _expand(value: object, environ: Mapping[str, str], key: str) -> str:
    if not isinstance(value, str):
        raise MissingCredentials(f"auth.{key} must be a string; {HOW_TO}")

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise MissingCredentials(
                f"auth.{key} refers to ${{{name}}}, which is not set in the runner's environment; "
                f"set {name}, or {HOW_TO}"
            )
        return environ[name]

    return _VAR_RE.sub(sub, value)
