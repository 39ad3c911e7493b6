"""`client.files.for_session(id)`: files stored with a session.

The server keeps them in its store (10 MiB each at most). A message may not
reference one yet: no harness passes files to the model, and the server
answers such a message with 400 `InvalidInputError`.
"""

from __future__ import annotations

import builtins
import mimetypes
from pathlib import Path
from urllib.parse import quote

from ._http import Transport
from ._types import File


class FilesNamespace:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def for_session(self, session_id: str) -> SessionFiles:
        """The files of one session (no request is made until you call a method)."""
        return SessionFiles(self._t, session_id)


class SessionFiles:
    def __init__(self, transport: Transport, session_id: str) -> None:
        self._t = transport
        self.session_id = session_id
        self._base = f"/v1/sessions/{quote(session_id, safe='')}/files"

    async def upload(self, path: str | Path | None = None, *, content: bytes | None = None,
                     filename: str | None = None, content_type: str | None = None) -> File:
        """Upload a local file (`path`), or `content` bytes under `filename`."""
        if content is None:
            if path is None:
                raise TypeError("upload() needs a path or content=")
            p = Path(path)
            content = p.read_bytes()
            filename = filename or p.name
        filename = filename or "file"
        content_type = content_type or mimetypes.guess_type(filename)[0] or "application/octet-stream"
        body = await self._t.request("POST", self._base,
                                     files={"file": (filename, content, content_type)})
        return File.from_dict(body)

    async def get(self, file_id: str) -> File:
        return File.from_dict(await self._t.request("GET", f"{self._base}/{quote(file_id, safe='')}"))

    async def get_content(self, file_id: str) -> bytes:
        resp = await self._t.send("GET", f"{self._base}/{quote(file_id, safe='')}/content")
        return resp.content

    async def list(self) -> builtins.list[File]:
        body = await self._t.request("GET", self._base)
        return [File.from_dict(row) for row in body["data"]]
