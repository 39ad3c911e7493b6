"""The runner's configuration: what its host put in its environment, checked before anything starts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit


class ConfigError(Exception):
    """The environment the supervisor should have set is missing or malformed."""


@dataclass(frozen=True)
class Config:
    server_url: str
    runner_id: str
    token: str

    @property
    def ws_url(self) -> str:
        parts = urlsplit(self.server_url)
        scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
        return f"{scheme}://{parts.netloc}{parts.path.rstrip('/')}/v1/runners/{self.runner_id}/ws"


def load_config(environ: Mapping[str, str]) -> Config:
    names = ("OMNIGENT_SERVER_URL", "OMNIGENT_RUNNER_ID", "OMNIGENT_RUNNER_TOKEN")
    missing = [n for n in names if not environ.get(n)]
    if missing:
        raise ConfigError(f"{', '.join(missing)} not set (the runner is started by an omnigent host)")
    url, runner_id, token = (environ[n] for n in names)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
        raise ConfigError(f"OMNIGENT_SERVER_URL must be an http(s) URL, got {url!r}")
    if not runner_id.isascii() or any(c in runner_id for c in "/?#% \t"):
        raise ConfigError(f"OMNIGENT_RUNNER_ID is not a valid runner id: {runner_id!r}")
    return Config(url, runner_id, token)
