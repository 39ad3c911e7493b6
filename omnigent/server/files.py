"""Session files: `POST/GET /v1/sessions/{id}/files`, one file's metadata and content.

Files live in the store's `files` table, each tied to one session and at most
`MAX_FILE_BYTES` (10 MiB). They are kept for clients (upload now, fetch
later); no harness passes a file to the model yet, so a message that
references one is refused with 400 "file attachments are not supported by
harness X" (`reject_attachments`) rather than silently answered without it.
The original's paths (`/resources/files`) are served too.
"""

from __future__ import annotations

from typing import Any

from quart import Response, request

from ._routes import conversation
from .errors import ApiError, invalid, not_found
from .state import ServerState

MAX_FILE_BYTES = 10 * 1024 * 1024
_ATTACHMENT_PARTS = ("input_file", "input_image")


def reject_attachments(content: Any, store: Any, conv: dict[str, Any]) -> None:
    """400 when a message's content references a file: it would not reach the model."""
    if not isinstance(content, list):
        return
    for part in content:
        if isinstance(part, dict) and (part.get("type") in _ATTACHMENT_PARTS or "file_id" in part):
            agent = store.get_agent(conv["agent_id"]) if conv.get("agent_id") else None
            harness = ((agent or {}).get("spec") or {}).get("harness") or "default"
            raise invalid(f"file attachments are not supported by harness {harness}")


def register(app: Any, state: ServerState) -> None:
    store = state.store

    def _file(session_id: str, file_id: str) -> dict[str, Any]:
        conversation(state, session_id)
        row = store.get_file(file_id)
        if row is None or row["conversation_id"] != session_id:
            raise not_found("File")
        return row

    async def upload(session_id: str):
        conversation(state, session_id)
        if not (request.content_type or "").startswith("multipart/form-data"):
            raise invalid("send the file as a multipart 'file' part")
        # the body is read (up to the app's MAX_CONTENT_LENGTH) before refusing it: answering
        # while a client still sends leaves it blocked on a full socket, never reading the 413
        part = (await request.files).get("file")
        if part is None:
            raise invalid("multipart part 'file' is missing")
        data = part.read()
        if len(data) > MAX_FILE_BYTES:
            raise ApiError("too_large", f"a file may be at most {MAX_FILE_BYTES} bytes")
        name = (part.filename or "").replace("\\", "/").rsplit("/", 1)[-1].strip()
        if not name or len(name) > 255 or any(ord(c) < 32 for c in name):
            raise invalid("the file part needs a filename (1-255 printable characters, no path)")
        row = store.create_file(session_id, name, data, part.content_type or "application/octet-stream")
        return _resource(row), 201

    async def list_files(session_id: str):
        conversation(state, session_id)
        return {"object": "list", "data": [_resource(r) for r in store.list_files(session_id)]}

    async def get_file(session_id: str, file_id: str):
        return _resource(_file(session_id, file_id))

    async def get_content(session_id: str, file_id: str):
        row = _file(session_id, file_id)
        return Response(row["data"], content_type=row["content_type"] or "application/octet-stream",
                        headers={"Content-Disposition": f'attachment; filename="{_quoted(row["filename"])}"'})

    for base in ("/v1/sessions/<session_id>/files", "/v1/sessions/<session_id>/resources/files"):
        tag = base.rsplit("/", 2)[-2]
        app.add_url_rule(base, f"files_upload_{tag}", upload, methods=["POST"])
        app.add_url_rule(base, f"files_list_{tag}", list_files, methods=["GET"])
        app.add_url_rule(f"{base}/<file_id>", f"files_get_{tag}", get_file, methods=["GET"])
        app.add_url_rule(f"{base}/<file_id>/content", f"files_content_{tag}", get_content, methods=["GET"])


def _resource(row: dict[str, Any]) -> dict[str, Any]:
    meta = {"filename": row["filename"], "bytes": row["bytes"], "content_type": row["content_type"],
            "created_at": row["created_at"]}
    return {"id": row["id"], "object": "file", "session_id": row["conversation_id"], **meta, "metadata": meta}


def _quoted(name: str) -> str:
    return "".join(c if c.isprintable() and c not in '"\\' and ord(c) < 128 else "_" for c in name)
