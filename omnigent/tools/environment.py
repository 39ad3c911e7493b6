"""The environment a tool's process gets, and what its output must never show.

A tool runs what the model asked for, so it gets the user's ordinary
variables (PATH, HOME, LANG, TERM, ...) and none of the credentials the
runner holds: the runner's own token and id, the host's and a remote
server's credentials, the model key (OPENAI_*), and anything that looks like
a secret by its name. The values dropped that are long enough to be
recognisable are redacted from every piece of tool output, so a secret that
reaches a tool some other way (a file, /proc of an ancestor) still never
reaches the model, the store or a terminal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

REDACTED = "[redacted]"
MIN_SECRET_LEN = 8  # shorter values would redact ordinary words

_DROP_PREFIXES = ("OMNIGENT_RUNNER_", "OMNIGENT_HOST_", "OMNIGENT_REMOTE_", "OPENAI_")
_DROP_SUFFIXES = ("_SECRET", "_TOKEN", "_KEY", "_PASSWORD", "_PASSWD", "_CREDENTIALS")


def _is_credential(name: str) -> bool:
    upper = name.upper()
    return upper.startswith(_DROP_PREFIXES) or upper.endswith(_DROP_SUFFIXES)


def scrub_env(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without any credential variable (see the module docstring); order kept."""
    return {k: v for k, v in environ.items() if not _is_credential(k)}


def secret_values(environ: Mapping[str, str]) -> list[str]:
    """The values scrub_env drops that are at least 8 characters long, longest first, no repeats.

    Longest first, so a secret that contains another is replaced whole.
    """
    found = {v for k, v in environ.items() if _is_credential(k) and len(v) >= MIN_SECRET_LEN}
    return sorted(found, key=lambda v: (-len(v), v))


def redact(text: str, secrets: Sequence[str]) -> str:
    """`text` with each occurrence of each secret replaced by "[redacted]"."""
    for secret in sorted(secrets, key=len, reverse=True):
        if secret and secret in text:
            text = text.replace(secret, REDACTED)
    return text
