"""Where omnigent keeps its files, and the guarantee that they are private.

Two roots, usually the same directory:
  - `data_dir()`: `$OMNIGENT_DATA_DIR`, else `$HOME/.omnigent`. The store, the
    REPL's input history and the logs of `omnigent run` and `omnigent server`
    live here, so `OMNIGENT_DATA_DIR` (and `--no-session`, which points it at
    a temporary directory) moves all of them together.
  - `home_dir()`: always `$HOME/.omnigent`. The host daemon's files (pid file,
    identity, `logs/host-daemon/`) are keyed by HOME, whatever the data dir.

Conversations are private: every directory omnigent creates is 0700 and
every file 0600 whatever the umask, and looser modes on an existing
directory or file of ours are tightened when it is opened.

Failures are `DiskError`s whose text is `<what failed>: <path>: <cause>`, so
the CLI prints one line. Read at call time (never at import) and free of
heavy imports: the cold start of `omnigent run` opens these first.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600
# Below this much free space a run would fail half-way (the store's WAL alone
# grows by a few hundred KiB in a turn), so it is refused before it starts.
MIN_FREE_BYTES = 1024 * 1024


class DiskError(Exception):
    """A file or directory omnigent needs cannot be used: `<what>: <path>: <cause>`, one line."""

    def __init__(self, what: str, path: str | os.PathLike, cause: object) -> None:
        self.what, self.path = what, str(path)
        self.cause = describe(cause)
        super().__init__(f"{what}: {self.path}: {self.cause}")

    def __reduce__(self):
        return (DiskError, (self.what, self.path, self.cause))


def describe(cause: object) -> str:
    """The human part of an error: an OSError's strerror, else its text on one line."""
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror
    return " ".join(str(cause).split()) or type(cause).__name__


def data_dir() -> Path:
    """`$OMNIGENT_DATA_DIR`, else `$HOME/.omnigent`: store, history and logs of run/server."""
    configured = os.environ.get("OMNIGENT_DATA_DIR")
    if configured:
        return Path(configured).expanduser()
    return home_dir()


def home_dir() -> Path:
    """`$HOME/.omnigent`, whatever `OMNIGENT_DATA_DIR` says: the host daemon's files."""
    home = os.environ.get("HOME")
    return (Path(home) if home else Path.home()) / ".omnigent"


def private_dir(path: str | os.PathLike, what: str = "cannot create directory", *, tighten: bool = True) -> Path:
    """`path` as a directory that only we can enter: created 0700 (with any
    missing parents), or, with `tighten`, made 0700 if it is ours and looser."""
    path = Path(path)
    missing = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    try:
        for d in reversed(missing):
            try:
                os.mkdir(d, DIR_MODE)
            except FileExistsError:
                pass
            os.chmod(d, DIR_MODE)  # mkdir's mode is cut by the umask only; this makes it exact
        st = os.stat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
        if tighten and st.st_mode & 0o077 and st.st_uid == os.geteuid():
            os.chmod(path, DIR_MODE)
    except OSError as e:
        raise DiskError(what, getattr(e, "filename", None) or path, e) from e
    return path


def tighten(path: str | os.PathLike) -> None:
    """Make an existing file of ours 0600 if it is looser; missing files are fine."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode) and st.st_mode & 0o077 and st.st_uid == os.geteuid():
        os.chmod(path, FILE_MODE)


def private_file(path: str | os.PathLike) -> None:
    """Create `path` empty with mode 0600 if it is missing, else tighten it (raises OSError)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        tighten(path)
        return
    try:
        os.fchmod(fd, FILE_MODE)  # exact, whatever the umask
    finally:
        os.close(fd)


def check_free_space(path: str | os.PathLike, what: str = "not enough disk space") -> None:
    """Refuse a directory whose file system is (nearly) full, before anything is written."""
    try:
        st = os.statvfs(path)
    except OSError:
        return  # nothing to learn; the real write reports its own error
    free = st.f_bavail * st.f_frsize
    if free < MIN_FREE_BYTES:
        raise DiskError(what, path, f"{os.strerror(errno.ENOSPC)} ({free // 1024} KiB free)")
