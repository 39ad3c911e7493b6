"""The file tools: read_file, write_file, edit_file, list_dir (grep is in `search`).

Each takes the parsed arguments and returns the text the model reads, or
raises `PathError`/`ToolError` with a one-line reason. Blocking: the package
runs them in a worker thread. Every open goes through `paths.Workspace`.
"""

from __future__ import annotations

import difflib
import os
import secrets
import stat

from .definitions import LIST_MAX_ENTRIES, READ_MAX_BYTES, READ_MAX_LINES, WRITE_MAX_BYTES
from .paths import MissingPath, PathError, Workspace, display, relative_parts

BINARY_SNIFF = 8192
DIFF_MAX_BYTES = 64 * 1024


class ToolError(Exception):
    """The model's arguments cannot be carried out; the message is one line for it."""


def _string(args: dict, key: str, *, default: str | None = None) -> str:
    value = args.get(key, default)
    if not isinstance(value, str):
        raise ToolError(f"argument {key!r} must be a string" if key in args else f"missing argument {key!r}")
    return value


def _integer(args: dict, key: str, default: int) -> int:
    value = args.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ToolError(f"argument {key!r} must be an integer")
    return int(value)


def _size(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB" if n < 1024 * 1024 else f"{n / 1048576:.1f} MiB"


def _is_binary(head: bytes) -> bool:
    return b"\x00" in head[:BINARY_SNIFF]


def _read_all(fd: int, limit: int) -> bytes:
    chunks, total = [], 0
    while total <= limit:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


# --- read_file ------------------------------------------------------------------

def read_file(ws: Workspace, args: dict) -> str:
    path = _string(args, "path")
    offset = _integer(args, "offset", 1)
    limit = _integer(args, "limit", READ_MAX_LINES)
    if offset < 1:
        raise ToolError("offset counts lines from 1")
    if limit < 1:
        raise ToolError("limit must be at least 1")
    limit = min(limit, READ_MAX_LINES)
    parts = relative_parts(ws.given, path)
    shown = display(parts)
    with ws.open_file(parts) as (fd, st):
        with open(fd, "rb", closefd=False) as f:
            if _is_binary(f.read(BINARY_SNIFF)):
                return f"{shown}: binary file ({_size(st.st_size)}); not shown"
            f.seek(0)
            return _numbered(f, shown, offset, limit)


def _numbered(f, shown: str, offset: int, limit: int) -> str:
    out: list[str] = []
    used = 0
    lineno = 0
    cut = ""
    while True:
        raw = f.readline(READ_MAX_BYTES + 1)
        if not raw:
            break
        lineno += 1
        if not raw.endswith(b"\n"):  # a very long line: keep its start, skip the rest
            while (more := f.readline(1 << 16)) and not more.endswith(b"\n"):
                pass
        if lineno < offset:
            continue
        if len(out) == limit:
            cut = f"[lines {offset}-{lineno - 1} shown; the file goes on: read on with offset={lineno}]"
            break
        text = raw.rstrip(b"\r\n").decode("utf-8", errors="replace")
        line = f"{lineno:>6}\t{text}\n"
        size = len(line.encode())
        if used + size > READ_MAX_BYTES:
            if not out:  # one line larger than the cap: show its start
                out.append(line.encode()[:READ_MAX_BYTES].decode("utf-8", errors="ignore") + "\n")
                cut = f"[line {lineno} cut at the 256 KiB cap; read on with offset={lineno + 1}]"
            else:
                cut = f"[lines {offset}-{lineno - 1} shown (256 KiB cap); read on with offset={lineno}]"
            break
        out.append(line)
        used += size
    if lineno == 0:
        return f"{shown}: (empty file)"
    if not out:
        return f"{shown}: offset {offset} is past the end of the file ({lineno} lines)"
    return "".join(out) + cut if cut else "".join(out).rstrip("\n")


# --- write_file / edit_file -------------------------------------------------------

def _replace(dir_fd: int, name: str, data: bytes, mode: int | None) -> None:
    """Put `data` at `name` by renaming a new file over it: never writes through a link."""
    tmp = f".omnigent-{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dir_fd)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, stat.S_IMODE(mode))
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def _target(ws: Workspace, dir_fd: int, name: str, shown: str) -> os.stat_result | None:
    st = ws.lstat_in(dir_fd, name)
    if st is None:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise PathError(f"{shown}: is a symbolic link; file tools do not follow symlinks")
    if stat.S_ISDIR(st.st_mode):
        raise PathError(f"{shown}: is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise PathError(f"{shown}: not a regular file")
    return st


def _write_args(ws: Workspace, args: dict) -> tuple[list[str], bytes]:
    path = _string(args, "path")
    data = _string(args, "content").encode("utf-8", errors="surrogatepass")
    if len(data) > WRITE_MAX_BYTES:
        raise ToolError(f"content is {_size(len(data))}; write_file writes at most 1 MiB")
    parts = relative_parts(ws.given, path)
    if not parts:
        raise PathError(f"{path}: is the workspace directory itself")
    return parts, data


def _read_current(ws: Workspace, dir_fd: int, name: str, shown: str) -> bytes | None:
    if _target(ws, dir_fd, name, shown) is None:
        return None
    with ws.open_in(dir_fd, name, shown) as (fd, _st):
        return _read_all(fd, WRITE_MAX_BYTES)


def write_file(ws: Workspace, args: dict) -> str:
    parts, data = _write_args(ws, args)
    shown = display(parts)
    with ws.directory(parts[:-1], create=True) as dir_fd:
        st = _target(ws, dir_fd, parts[-1], shown)
        try:
            _replace(dir_fd, parts[-1], data, st.st_mode if st else None)
        except IsADirectoryError:
            raise PathError(f"{shown}: is a directory") from None
        except OSError as exc:
            raise PathError(f"{shown}: cannot write: {exc.strerror}") from None
    return f"wrote {len(data)} bytes to {shown} ({'replaced' if st else 'created'})"


def _edit(ws: Workspace, dir_fd: int, args: dict, parts: list[str]) -> tuple[bytes, bytes, int]:
    """(old content, new content, line of the change) or a ToolError saying why not."""
    old_string, new_string = _string(args, "old_string"), _string(args, "new_string")
    shown = display(parts)
    if not old_string:
        raise ToolError("old_string is empty; use write_file to create or replace a whole file")
    if old_string == new_string:
        raise ToolError("old_string and new_string are the same; nothing to change")
    current = _read_current(ws, dir_fd, parts[-1], shown)
    if current is None:
        raise PathError(f"{shown}: no such file (use write_file to create it)")
    if len(current) > WRITE_MAX_BYTES:
        raise ToolError(f"{shown}: larger than 1 MiB; edit_file edits files up to 1 MiB")
    text = current.decode("utf-8", errors="surrogateescape")
    count = text.count(old_string)
    if count == 0:
        raise ToolError(f"{shown}: old_string not found, nothing changed; copy the text exactly, whitespace included")
    if count > 1:
        raise ToolError(f"{shown}: old_string matches {count} times, nothing changed; "
                        "include more surrounding text so it matches exactly once")
    at = text.index(old_string)
    new = (text[:at] + new_string + text[at + len(old_string):]).encode("utf-8", errors="surrogateescape")
    if len(new) > WRITE_MAX_BYTES:
        raise ToolError(f"{shown}: the edited file would be {_size(len(new))}; at most 1 MiB")
    return current, new, text.count("\n", 0, at) + 1


def edit_file(ws: Workspace, args: dict) -> str:
    parts = relative_parts(ws.given, _string(args, "path"))
    if not parts:
        raise PathError("the workspace directory itself is not a file")
    with ws.directory(parts[:-1]) as dir_fd:
        _old, new, line = _edit(ws, dir_fd, args, parts)
        mode = ws.lstat_in(dir_fd, parts[-1])
        try:
            _replace(dir_fd, parts[-1], new, mode.st_mode if mode else None)
        except OSError as exc:
            raise PathError(f"{display(parts)}: cannot write: {exc.strerror}") from None
    return f"edited {display(parts)}: replaced 1 occurrence at line {line}"


def preview(ws: Workspace, name: str, args: dict) -> str:
    """The unified diff write_file or edit_file would make; raises like the tool would."""
    if name == "write_file":
        parts, new = _write_args(ws, args)
        try:
            with ws.directory(parts[:-1]) as dir_fd:
                old = _read_current(ws, dir_fd, parts[-1], display(parts)) or b""
        except MissingPath:
            old = b""  # the directories do not exist yet: all of it is new
    elif name == "edit_file":
        parts = relative_parts(ws.given, _string(args, "path"))
        if not parts:
            return ""
        with ws.directory(parts[:-1]) as dir_fd:
            old, new, _line = _edit(ws, dir_fd, args, parts)
    else:
        return ""
    shown = display(parts)
    diff = "".join(difflib.unified_diff(
        old.decode("utf-8", errors="replace").splitlines(keepends=True),
        new.decode("utf-8", errors="replace").splitlines(keepends=True),
        fromfile=f"a/{shown}" if old else "/dev/null", tofile=f"b/{shown}"))
    if len(diff) > DIFF_MAX_BYTES:
        diff = diff[:DIFF_MAX_BYTES] + f"\n[... diff cut at 64 KiB ({len(diff)} characters in all) ...]\n"
    return diff


# --- list_dir ------------------------------------------------------------------------

def list_dir(ws: Workspace, args: dict) -> str:
    path = _string(args, "path", default=".")
    parts = relative_parts(ws.given, path)
    shown = display(parts)
    with ws.directory(parts) as dir_fd:
        with os.scandir(dir_fd) as it:
            entries = sorted(it, key=lambda e: e.name)
        lines = []
        for entry in entries[:LIST_MAX_ENTRIES]:
            lines.append(_entry_line(dir_fd, entry))
    if not entries:
        return f"{shown}/: (empty directory)"
    head = f"{shown}/: {len(entries)} entries"
    more = len(entries) - LIST_MAX_ENTRIES
    tail = f"\n[... {more} more entries not shown (1,000 entry cap)]" if more > 0 else ""
    return head + "\n" + "\n".join(lines) + tail


def _entry_line(dir_fd: int, entry: os.DirEntry) -> str:
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return f"?        {entry.name}"
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        try:
            target = os.readlink(entry.name, dir_fd=dir_fd)
        except OSError:
            target = "?"
        return f"symlink  {entry.name} -> {target} (not followed)"
    if stat.S_ISDIR(mode):
        return f"dir      {entry.name}/"
    if stat.S_ISREG(mode):
        return f"file     {entry.name} ({_size(st.st_size)})"
    kind = "fifo" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode) else "device" if (
        stat.S_ISCHR(mode) or stat.S_ISBLK(mode)) else "other"
    return f"{kind:<8} {entry.name}"
