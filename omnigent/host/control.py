"""The daemon's local control socket: how `omnigent run --server` of the same HOME talks to it.

An AF_UNIX stream socket at `$HOME/.omnigent/daemons/<key>.sock`, 0600 in a
0700 folder, so only this user reaches it. One JSON object per line each way,
one answer per request:

- `{"op": "hello"}` -> `{"ok": true, "host_id", "pid", "protocol_version", "online"}`
- `{"op": "allow_workspace", "workspace": DIR}` -> `{"ok": true}`
- `{"op": "session_env", "session_id": ID, "env": {...}}` -> `{"ok": true}`
- `{"op": "session_runner", "session_id": ID}` -> `{"ok": true, "kept": bool}`: whether this
  daemon keeps a runner for that session (alive, or being replaced by its supervisor)
- `{"op": "status"}` -> `{"ok": true, "runners": [...], ...}`

Anything else, or a malformed line, gets `{"ok": false, "error": "..."}`.
This is the only way model credentials reach a reused daemon: they are kept
in its memory, never in a file, an argv or the store.

Paths longer than AF_UNIX allows (~107 bytes: deep test HOMEs) are reached
through `/proc/self/fd/<dir fd>/<name>`, which names the same file.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Awaitable, Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import trio

MAX_LINE = 256 * 1024
_SUN_PATH_MAX = 100  # below the kernel's 108, with room to spare

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class ControlError(Exception):
    """The daemon could not be reached over its control socket, or it refused the request."""


@contextmanager
def _address(path: Path) -> Iterator[str]:
    """A name for `path` that fits in a sockaddr_un (see module doc)."""
    text = str(path)
    if len(text.encode()) <= _SUN_PATH_MAX:
        yield text
        return
    fd = os.open(path.parent, os.O_PATH | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


async def serve(path: Path, handler: Handler, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Listen on `path` (replacing a stale socket file) until cancelled; started once listening."""
    path.unlink(missing_ok=True)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with _address(path) as address:
            old = os.umask(0o177)  # created 0600, never briefly looser
            try:
                await sock.bind(address)
            finally:
                os.umask(old)
        os.chmod(path, 0o600)
        sock.listen(16)
    except BaseException:
        sock.close()
        raise
    listener = trio.SocketListener(sock)

    async def conversation(stream: trio.SocketStream) -> None:
        async with stream:
            buffer = b""
            while True:
                try:
                    chunk = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    return
                if not chunk:
                    return
                buffer += chunk
                if len(buffer) > MAX_LINE and b"\n" not in buffer:
                    await _send(stream, {"ok": False, "error": "request too long"})
                    return
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    answer = await _answer(handler, line)
                    try:
                        await _send(stream, answer)
                    except trio.BrokenResourceError:
                        return

    try:
        await trio.serve_listeners(conversation, [listener], task_status=task_status)
    finally:
        path.unlink(missing_ok=True)


async def _answer(handler: Handler, line: bytes) -> dict[str, Any]:
    try:
        request = json.loads(line)
    except ValueError:
        return {"ok": False, "error": "not a JSON line"}
    if not isinstance(request, dict) or not isinstance(request.get("op"), str):
        return {"ok": False, "error": "expected an object with an 'op'"}
    try:
        return await handler(request)
    except ControlError as exc:
        return {"ok": False, "error": str(exc)}


async def _send(stream: trio.SocketStream, obj: dict[str, Any]) -> None:
    await stream.send_all(json.dumps(obj).encode() + b"\n")


async def request(path: Path, obj: dict[str, Any], *, timeout: float = 10.0) -> dict[str, Any]:
    """Send one request and return the answer; ControlError when the daemon is not there or says no."""
    try:
        with trio.fail_after(timeout):
            with _address(path) as address:
                stream = await trio.open_unix_socket(address)
            async with stream:
                await _send(stream, obj)
                buffer = b""
                while b"\n" not in buffer:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        raise ControlError("the host daemon closed its control socket")
                    buffer += chunk
                    if len(buffer) > MAX_LINE:
                        raise ControlError("the host daemon's answer is too long")
    except (OSError, trio.BrokenResourceError) as exc:
        raise ControlError(f"cannot reach the host daemon at {path}: {exc.strerror or exc}"
                           if isinstance(exc, OSError) else f"cannot reach the host daemon: {exc}") from None
    except trio.TooSlowError:
        raise ControlError(f"the host daemon at {path} did not answer within {timeout:g} s") from None
    try:
        answer = json.loads(buffer.split(b"\n", 1)[0])
    except ValueError:
        raise ControlError("the host daemon's answer is not JSON") from None
    if not isinstance(answer, dict) or not answer.get("ok"):
        message = answer.get("error") if isinstance(answer, dict) else None
        raise ControlError(f"the host daemon refused {obj.get('op')!r}: {message or answer!r}")
    return answer
