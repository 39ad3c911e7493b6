"""Loading an agent from disk: a .yaml/.yml file, an agent directory or a .tar.gz bundle.

The one place that knows every form an agent path can take, so `spec`
(checking a document) and `bundle` (packing and unpacking archives) need
not know each other's file handling: this module uses both, neither uses it.
Every failure is a one-line `SpecError` naming the path.
"""

from __future__ import annotations

import os

from .bundle import bundle_document
from .spec import AgentSpec, SpecError, build_spec, parse_yaml, read_capped, select_document


def load_spec(
    path: str | os.PathLike,
    *,
    model: str | None = None,
    harness: str | None = None,
    system_prompt: str | None = None,
) -> AgentSpec:
    """Load a .yaml/.yml file, an agent directory or a .tar.gz bundle and apply overrides."""
    p = os.fspath(path)
    doc, source = _load_document(p)
    return build_spec(doc, source, model=model, harness=harness, system_prompt=system_prompt)


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
