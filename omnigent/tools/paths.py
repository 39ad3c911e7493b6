"""Opening paths inside the workspace, so that no path, symlink or race gets a file tool out.

The check happens at open time, not before: a path is split into components
and each one is opened with `O_NOFOLLOW` relative to the directory fd of the
one before, starting from the workspace's own fd. A symlink anywhere (a
directory on the way or the file itself) is refused, not followed, so a
`shell` call that swaps a file for a symlink between a check and the open
cannot redirect the open. The fd finally reached is checked once more by
its real path (`/proc/self/fd/N`): that catches a directory on the way being
moved out of the workspace while we held it.

Paths are read lexically first: relative to the workspace, `a/../b` is `b`,
and a path that climbs out (`../x`) or an absolute path outside is refused
before anything is opened. Hard links cannot be told from ordinary files; writes
replace a file by renaming a new one over it, so a write never goes through a
hard or symbolic link to a file outside.

Everything here is blocking and meant to run in a worker thread.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PathError(Exception):
    """A path the model gave cannot be used; the message is one line for the model."""


class MissingPath(PathError):
    """A component of the path does not exist (yet)."""


def relative_parts(workspace: str, path: str) -> list[str]:
    """The components of `path` below the workspace root ([] for the root itself)."""
    if not isinstance(path, str):
        raise PathError("path must be a string")
    if "\x00" in path:
        raise PathError("path contains a NUL byte")
    raw = path.strip() or "."
    if os.path.isabs(raw):
        absolute = os.path.normpath(raw)
        for root in {os.path.normpath(workspace), os.path.realpath(workspace)}:
            if absolute == root or absolute.startswith(root.rstrip(os.sep) + os.sep):
                raw = os.path.relpath(absolute, root)
                break
        else:
            raise PathError(f"{path}: outside the workspace ({workspace}); only paths inside it are allowed")
    normal = os.path.normpath(raw)
    if normal == ".." or normal.startswith(".." + os.sep):
        raise PathError(f"{path}: outside the workspace ({workspace}); '..' may not climb out of it")
    return [] if normal == "." else normal.split(os.sep)


def display(parts: list[str]) -> str:
    return "/".join(parts) or "."


def _explain(dir_fd: int, name: str, shown: str, error: OSError) -> PathError:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode):
        return PathError(f"{shown}: is a symbolic link; file tools do not follow symlinks")
    if error.errno == errno.ENOENT:
        return MissingPath(f"{shown}: no such file or directory")
    if error.errno == errno.ENOTDIR:
        return PathError(f"{shown}: not a directory")
    if error.errno == errno.EACCES:
        return PathError(f"{shown}: permission denied")
    return PathError(f"{shown}: {error.strerror or error}")


def check_inside(fd: int, workspace_real: str, shown: str) -> None:
    """Refuse `fd` unless its real path is the workspace or below it."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return  # no /proc: the O_NOFOLLOW walk alone stands
    if not (real == workspace_real or real.startswith(workspace_real.rstrip(os.sep) + os.sep)):
        raise PathError(f"{shown}: resolves outside the workspace; refused")


class Workspace:
    """The root every file tool works under: its real path, opened fresh for each call."""

    def __init__(self, workspace: str) -> None:
        self.given = workspace
        self.real = os.path.realpath(workspace)

    def _root_fd(self) -> int:
        try:
            return os.open(self.real, _DIR_FLAGS)
        except OSError as exc:
            raise PathError(f"the workspace {self.given} cannot be opened: {exc.strerror}") from None

    @contextmanager
    def directory(self, parts: list[str], *, create: bool = False) -> Iterator[int]:
        """An fd of the directory `parts` (every component a real directory, no symlink).

        `create` makes missing directories on the way (0777 less the umask).
        """
        fd = self._root_fd()
        try:
            for i, name in enumerate(parts):
                shown = display(parts[: i + 1])
                try:
                    next_fd = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError as exc:
                    if not create:
                        raise _explain(fd, name, shown, exc) from None
                    try:
                        os.mkdir(name, 0o777, dir_fd=fd)
                    except FileExistsError:
                        pass
                    except OSError as exc2:
                        raise _explain(fd, name, shown, exc2) from None
                    try:
                        next_fd = os.open(name, _DIR_FLAGS, dir_fd=fd)
                    except OSError as exc2:
                        raise _explain(fd, name, shown, exc2) from None
                except OSError as exc:
                    raise _explain(fd, name, shown, exc) from None
                os.close(fd)
                fd = next_fd
            check_inside(fd, self.real, display(parts))
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def open_file(self, parts: list[str]) -> Iterator[tuple[int, os.stat_result]]:
        """A read-only fd of the regular file `parts`, and its stat."""
        if not parts:
            raise PathError(".: is a directory (use list_dir)")
        with self.directory(parts[:-1]) as dir_fd:
            with self.open_in(dir_fd, parts[-1], display(parts)) as opened:
                yield opened

    @contextmanager
    def open_in(self, dir_fd: int, name: str, shown: str) -> Iterator[tuple[int, os.stat_result]]:
        """A read-only fd of the regular file `name` in `dir_fd` (not a symlink), and its stat."""
        try:
            # O_NONBLOCK: opening a FIFO must not hang the tool
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
        except OSError as exc:
            raise _explain(dir_fd, name, shown, exc) from None
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise PathError(f"{shown}: is a directory (use list_dir)")
            if not stat.S_ISREG(st.st_mode):
                raise PathError(f"{shown}: not a regular file")
            os.set_blocking(fd, True)
            check_inside(fd, self.real, shown)
            yield fd, st
        finally:
            os.close(fd)

    def lstat_in(self, dir_fd: int, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
