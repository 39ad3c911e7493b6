"""The grep tool: a Python regular expression over the files of the workspace.

The walk opens every directory with `O_NOFOLLOW` relative to its parent's
fd, so it never leaves the workspace: symlinks (to files or directories) are
skipped, not followed; so are `.git` directories and binary files (a NUL in
the first 8 KiB). Files are visited in name order, so the same tree gives the
same answer. Blocking: run in a worker thread with a `stop` flag.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
import threading

from .definitions import GREP_MAX_MATCHES
from .files import BINARY_SNIFF, ToolError, _string
from .paths import _DIR_FLAGS, PathError, Workspace, check_inside, display, relative_parts

LINE_SHOWN = 300          # characters of a matching line shown
LINE_READ = 1 << 20       # a line longer than this is searched in pieces
SKIP_DIRS = frozenset({".git"})


class _Done(Exception):
    pass


class _Search:
    def __init__(self, ws: Workspace, regex: re.Pattern, glob: str | None, stop: threading.Event | None):
        self.ws, self.regex, self.glob, self.stop = ws, regex, glob, stop
        self.matches: list[str] = []
        self.files = 0
        self.capped = False

    def wanted(self, rel_root: str, name: str) -> bool:
        if not self.glob:
            return True
        return fnmatch.fnmatch(name, self.glob) or fnmatch.fnmatch(rel_root, self.glob)

    def file(self, dir_fd: int, name: str, shown: str) -> None:
        if self.stop is not None and self.stop.is_set():
            raise _Done
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
        except OSError:
            return
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return
            os.set_blocking(fd, True)
            with open(fd, "rb", closefd=False) as f:
                if b"\x00" in f.read(BINARY_SNIFF):
                    return
                f.seek(0)
                self.files += 1
                lineno = 0
                while raw := f.readline(LINE_READ):
                    if raw.endswith(b"\n") or len(raw) < LINE_READ:
                        lineno += 1
                    text = raw.rstrip(b"\r\n").decode("utf-8", errors="replace")
                    if self.regex.search(text):
                        if len(text) > LINE_SHOWN:
                            text = text[:LINE_SHOWN] + " [...]"
                        self.matches.append(f"{shown}:{lineno}:{text}")
                        if len(self.matches) >= GREP_MAX_MATCHES:
                            self.capped = True
                            raise _Done
        finally:
            os.close(fd)

    def walk(self, dir_fd: int, prefix: list[str], rel: list[str]) -> None:
        if self.stop is not None and self.stop.is_set():
            raise _Done
        check_inside(dir_fd, self.ws.real, display(prefix))
        with os.scandir(dir_fd) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            if stat.S_ISLNK(mode):
                continue
            if stat.S_ISDIR(mode):
                if entry.name in SKIP_DIRS:
                    continue
                try:
                    sub = os.open(entry.name, _DIR_FLAGS, dir_fd=dir_fd)
                except OSError:
                    continue
                try:
                    self.walk(sub, prefix + [entry.name], rel + [entry.name])
                finally:
                    os.close(sub)
            elif stat.S_ISREG(mode) and self.wanted("/".join(rel + [entry.name]), entry.name):
                self.file(dir_fd, entry.name, display(prefix + [entry.name]))


def grep(ws: Workspace, args: dict, *, stop: threading.Event | None = None) -> str:
    pattern = _string(args, "pattern")
    path = _string(args, "path", default=".")
    glob = args.get("glob")
    if glob is not None and not isinstance(glob, str):
        raise ToolError("argument 'glob' must be a string")
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ToolError(f"invalid regular expression {pattern!r}: {exc}") from None
    parts = relative_parts(ws.given, path)
    search = _Search(ws, regex, glob or None, stop)
    try:
        with ws.directory(parts[:-1] if parts else []) as parent_fd:
            st = ws.lstat_in(parent_fd, parts[-1]) if parts else None
            if parts and st is None:
                raise PathError(f"{display(parts)}: no such file or directory")
            if st is not None and stat.S_ISREG(st.st_mode):
                search.file(parent_fd, parts[-1], display(parts))
            else:
                with ws.directory(parts) as dir_fd:
                    search.walk(dir_fd, parts, [])
    except _Done:
        pass
    if not search.matches:
        return f"no matches ({search.files} files searched)"
    out = "\n".join(search.matches)
    if search.capped:
        out += f"\n[stopped at {GREP_MAX_MATCHES} matches; narrow the pattern, the path or the glob]"
    return out
