"""Loading an agent from disk: a .yaml/.yml file, an agent directory or a .tar.gz bundle.

The one place that knows every form an agent path can take, so `spec`
(checking a document) and `bundle` (packing and unpacking archives) need
not know each other's file handling: this module uses both, neither uses it.
Every failure is a one-line `SpecError` naming the path.

It is also where `model` and `harness` are chosen (`pick`): a flag, else the
environment (`OMNIGENT_MODEL`, `OMNIGENT_HARNESS`), else the agent file, else
the config file's default. The environment outranks the file on purpose: it
is how one shell, script or CI job says "this model, whatever the agents say"
without editing them; the config file is below the file because it holds the
user's defaults, not an override.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..config.file import ENV_OVERRIDES
from .bundle import bundle_document
from .documents import parse_yaml, read_capped, select_document
from .errors import SpecError
from .spec import AgentSpec, _harness, build_spec

ENV_VARS = ENV_OVERRIDES
# Where a chosen value came from, as `pick` names it (and `omnigent config list` shows it).
FLAG, ENV, AGENT, CONFIG, UNSET = "flag", "env", "agent", "config", "unset"


def pick(key: str, *, flag: str | None, environ: Mapping[str, str], agent: object,
         config: str | None) -> tuple[str | None, str]:
    """(value, source) of `model` or `harness`: flag > environment > agent file > config.

    An empty environment variable counts as unset. `agent` is what the file
    says (None: nothing); it is returned as is, for `build_spec` to check.
    """
    if flag is not None:
        return flag, FLAG
    env = (environ.get(ENV_VARS[key]) or "").strip()
    if env:
        return env, ENV
    if agent is not None:
        return (agent if isinstance(agent, str) else None), AGENT
    if config is not None:
        return config, CONFIG
    return None, UNSET


def load_spec(
    path: str | os.PathLike,
    *,
    model: str | None = None,
    harness: str | None = None,
    system_prompt: str | None = None,
    environ: Mapping[str, str] | None = None,
    defaults: Mapping[str, str | None] | None = None,
) -> AgentSpec:
    """Load a .yaml/.yml file, an agent directory or a .tar.gz bundle and apply overrides.

    `model` and `harness` are the flags. With `environ` (the CLI passes
    `os.environ`) and `defaults` (the config file's `model`/`harness`), each is
    chosen by `pick`; without them the flags simply override the file.
    """
    p = os.fspath(path)
    doc, source = _load_document(p)
    if environ is not None or defaults is not None:
        model, harness = _choose(doc, source, model=model, harness=harness,
                                 environ=environ or {}, defaults=defaults or {})
    return build_spec(doc, source, model=model, harness=harness, system_prompt=system_prompt)


def _choose(doc: object, source: str, *, model: str | None, harness: str | None,
            environ: Mapping[str, str], defaults: Mapping[str, str | None]) -> tuple[str | None, str | None]:
    """The overrides to hand `build_spec`: the picked value unless the agent file's own won."""
    executor = doc.get("executor") if isinstance(doc, dict) else None
    executor = executor if isinstance(executor, dict) else {}
    chosen: dict[str, str | None] = {}
    for key, flag in (("model", model), ("harness", harness)):
        value, where = pick(key, flag=flag, environ=environ, agent=executor.get(key), config=defaults.get(key))
        if where == ENV and key == "harness":
            _harness(value, source, ENV_VARS[key])  # named as the variable, not as --harness
        chosen[key] = None if where in (AGENT, UNSET) else value
    return chosen["model"], chosen["harness"]


def _load_document(p: str) -> tuple[object, str]:
    if os.path.isdir(p):
        try:
            names = sorted(n for n in os.listdir(p) if os.path.isfile(os.path.join(p, n)))
        except OSError as e:
            raise SpecError(p, f"cannot read ({e.strerror or e})") from e
        return select_document(p, names, lambda n: read_capped(os.path.join(p, n)), lambda n: os.path.join(p, n))
    if not os.path.exists(p):
        raise SpecError(p, "no such file")
    low = p.lower()
    if low.endswith((".yaml", ".yml")):
        return parse_yaml(read_capped(p), p), p
    if low.endswith((".tar.gz", ".tgz")):
        return bundle_document(read_capped(p), p)
    raise SpecError(p, "not an agent spec (expected a .yaml/.yml file, a directory or a .tar.gz bundle)")
