"""The environment a daemon-launched runner gets: an allow-list, never the daemon's whole one.

A host daemon is reused by every `omnigent run --server` of its HOME, so its
own environment is whatever the first of them had. A runner gets only what it
needs to run a model call: the process essentials (PATH, HOME, locale, TLS
trust and proxies), `OPENAI_*`, `OMNIGENT_*` settings, the names the user
listed in `OMNIGENT_RUNNER_ENV_PASSTHROUGH`, and the model endpoint and key
that its session's own client handed the daemon (`session_env`). It never
gets another role's credential: the client token (`OMNIGENT_REMOTE_AUTH_TOKEN`),
the server token (`OMNIGENT_SERVER_TOKEN`) or the host secret; those are
dropped even when a passthrough list or a session names them. The runner's
own secret is added by the pool after this filter, and so is the host's
tool policy (`OMNIGENT_TOOL_POLICY`, from `omnigent host --permissions`):
neither the daemon's inherited environment nor a session can set that one,
so a bundle from a client cannot raise what tools may do on this machine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..link.runner_secrets import CLIENT_TOKEN_VARS, ENV_VAR

PASSTHROUGH_VAR = "OMNIGENT_RUNNER_ENV_PASSTHROUGH"
HOST_SECRET_VAR = "OMNIGENT_HOST_SECRET"
REMOTE_AUTH_VAR = "OMNIGENT_REMOTE_AUTH_TOKEN"
# the most a runner's tools may do (ask | auto | deny): the runner enforces it again (issue 9)
TOOL_POLICY_VAR = "OMNIGENT_TOOL_POLICY"
TOOL_POLICIES = ("ask", "auto", "deny")

# never handed to a runner, whoever asks (the pool sets the tool policy itself)
FORBIDDEN = frozenset({*CLIENT_TOKEN_VARS, REMOTE_AUTH_VAR, HOST_SECRET_VAR, ENV_VAR, TOOL_POLICY_VAR})

_ESSENTIALS = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "TZ", "TERM", "LANG", "LANGUAGE",
    "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV",
    # TLS trust: a corporate CA must keep working for the model endpoint
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    # outgoing proxies, for the same reason
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
    "http_proxy", "https_proxy", "no_proxy", "all_proxy",
})
_PREFIXES = ("LC_", "OPENAI_", "OMNIGENT_")


def allowed_name(name: str, passthrough: Iterable[str] = ()) -> bool:
    """Whether a variable of this name may reach a runner."""
    if name in FORBIDDEN:
        return False
    return name in _ESSENTIALS or name.startswith(_PREFIXES) or name in set(passthrough)


def passthrough_names(environ: Mapping[str, str]) -> list[str]:
    """`OMNIGENT_RUNNER_ENV_PASSTHROUGH`: names separated by commas or blanks."""
    raw = environ.get(PASSTHROUGH_VAR, "")
    return [name for name in raw.replace(",", " ").split() if name]


def runner_env(environ: Mapping[str, str], session_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allow-listed part of `environ`, then `session_env` on top (filtered the same way)."""
    names = passthrough_names(environ)
    env = {k: v for k, v in environ.items() if allowed_name(k, names)}
    env.update(clean_session_env(session_env or {}, names))
    return env


def clean_session_env(session_env: Mapping[str, str], passthrough: Iterable[str] = ()) -> dict[str, str]:
    """What a client may hand over for its session: allow-listed string values only."""
    names = list(passthrough)
    return {k: v for k, v in session_env.items()
            if isinstance(k, str) and isinstance(v, str) and allowed_name(k, names)}
