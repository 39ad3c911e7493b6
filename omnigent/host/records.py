"""The host daemon's files under `$HOME/.omnigent/`, and the lock that says a daemon is alive.

One daemon per (HOME, server URL). Everything is keyed by HOME, never by
`OMNIGENT_CONFIG_HOME` or the data dir: two HOMEs on one machine are two hosts.

- `hosts/<key>.json` (0600): the identity `{server_url, host_id, host_secret}`
  from `POST /v1/hosts`, reused on every reconnect.
- `daemons/<key>.json`: the record `{pid, server_url, host_id, control_socket,
  protocol_version, started_at, permissions, log_path}` of the daemon that runs now
  (`permissions`: its `--permissions`, the most its runners' tools may do).
- `daemons/<key>.lock`: held (flock) by that daemon for its whole life. A
  record whose lock nobody holds is stale: its pid may be anyone's by now,
  so it is replaced, never signalled. The kernel drops the lock when the
  daemon dies, however it dies.
- `daemons/<key>.start.lock`: held by whoever is starting a daemon, so two
  concurrent starts are serialized (the second finds the first's daemon).
- `daemons/<key>.sock`: the control socket (see `control.py`).
- `host.pid`: `<pid>\n<server url>\n` of the daemon started last (the seeds read line 1).

`key` is the first 16 hex digits of the sha256 of the normalized server URL.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from ..config.dirs import FILE_MODE, private_dir


def normalize_url(url: str) -> str:
    """`HTTP://Host:80/x/` and `http://host/x` name one server.

    Lowercase scheme and host, no default port, no trailing slash.
    """
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    port = parts.port
    if port is not None and (scheme, port) not in (("http", 80), ("https", 443)):
        host = f"{host}:{port}"
    return urlunsplit((scheme, host, parts.path.rstrip("/"), "", ""))


def key_of(server_url: str) -> str:
    return hashlib.sha256(normalize_url(server_url).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Paths:
    """Every file of the daemon for one (HOME, server URL)."""

    root: Path  # $HOME/.omnigent
    server_url: str

    @classmethod
    def of(cls, home: Path, server_url: str) -> Paths:
        return cls(Path(home) / ".omnigent", normalize_url(server_url))

    @property
    def key(self) -> str:
        return key_of(self.server_url)

    @property
    def identity(self) -> Path:
        return self.root / "hosts" / f"{self.key}.json"

    @property
    def record(self) -> Path:
        return self.root / "daemons" / f"{self.key}.json"

    @property
    def lock(self) -> Path:
        return self.root / "daemons" / f"{self.key}.lock"

    @property
    def start_lock(self) -> Path:
        return self.root / "daemons" / f"{self.key}.start.lock"

    @property
    def socket(self) -> Path:
        return self.root / "daemons" / f"{self.key}.sock"

    @property
    def pid_file(self) -> Path:
        return self.root / "host.pid"

    @property
    def log_dir(self) -> Path:
        return self.root / "logs" / "host-daemon"

    @property
    def logs_root(self) -> Path:
        return self.root / "logs"


# --- small private files ---------------------------------------------------------


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` atomically (a 0600 temp file renamed over it), in a 0700 folder."""
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    """The object in `path`, or None when it is missing or not a JSON object (a torn or foreign file)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_identity(paths: Paths) -> tuple[str, str] | None:
    """(host_id, host_secret) stored for this server, or None."""
    data = read_json(paths.identity)
    if not data or data.get("server_url") != paths.server_url:
        return None
    host_id, secret = data.get("host_id"), data.get("host_secret")
    if isinstance(host_id, str) and isinstance(secret, str) and host_id and secret:
        return host_id, secret
    return None


def write_identity(paths: Paths, host_id: str, host_secret: str) -> None:
    write_private(paths.identity, json.dumps(
        {"server_url": paths.server_url, "host_id": host_id, "host_secret": host_secret}) + "\n")


# --- the liveness lock -------------------------------------------------------------


class Lock:
    """An exclusive flock on a file, held until `release` (or the process ends)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None

    def try_acquire(self) -> bool:
        private_dir(self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def lock_held(path: Path) -> bool:
    """Whether some process holds the flock on `path` (i.e. its daemon is alive)."""
    probe = Lock(path)
    if probe.try_acquire():
        probe.release()
        return False
    return True


def live_record(paths: Paths) -> dict | None:
    """The record of the daemon that runs now for these paths, or None (none, or a stale one)."""
    if not paths.lock.exists() or not lock_held(paths.lock):
        return None
    return read_json(paths.record)


def write_pid_file(paths: Paths, pid: int) -> None:
    write_private(paths.pid_file, f"{pid}\n{paths.server_url}\n")


def clear_own_files(paths: Paths, pid: int) -> None:
    """At a daemon's exit: remove its record, socket and `host.pid`, if they are still its own."""
    record = read_json(paths.record)
    if record is not None and record.get("pid") == pid:
        paths.record.unlink(missing_ok=True)
        paths.socket.unlink(missing_ok=True)
    try:
        first = paths.pid_file.read_text().splitlines()[0]
    except (OSError, IndexError):
        return
    if first == str(pid):
        paths.pid_file.unlink(missing_ok=True)
