"""Agent specs and bundles: what `omnigent run AGENT` reads and uploads.

`spec` checks agent YAML (parsed and bounded by `documents`, failing with
`errors.SpecError`), `auth` resolves its credentials at use time; `bundle`
packs specs into, and reads them back from, uploadable .tar.gz bytes;
`load` finds and reads an agent path (file, directory or bundle) with both.
"""

from .auth import resolve_auth
from .bundle import bundle_bytes, bundle_from_spec, spec_from_bundle
from .errors import SpecError
from .load import load_spec
from .spec import DEFAULT_HARNESS, DEFAULT_MODEL, HARNESSES, AgentSpec

__all__ = [
    "DEFAULT_HARNESS",
    "DEFAULT_MODEL",
    "HARNESSES",
    "AgentSpec",
    "SpecError",
    "bundle_bytes",
    "bundle_from_spec",
    "load_spec",
    "resolve_auth",
    "spec_from_bundle",
]
