"""The `files` table: files uploaded to a conversation (or to none), data kept in the row.

Guarantees: listings never carry the data, only `get_file` does; a file
names an existing conversation or none.
"""

from __future__ import annotations

from . import ids
from ._base import Tables

_FILE_META = "id, conversation_id, filename, bytes, content_type, created_at"


class FilesMixin(Tables):
    def create_file(
        self,
        conversation_id: str | None,
        filename: str,
        data: bytes,
        content_type: str | None = "application/octet-stream",
    ) -> dict:
        """Store a file; returns its metadata (no data)."""
        file_id = ids.new_id(ids.FILE)
        with self._write():
            if conversation_id is not None:
                self._require_conversation(conversation_id)
            self.db.execute(
                f"INSERT INTO files ({_FILE_META}, data) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [file_id, conversation_id, filename, len(data), content_type, self._clock(), bytes(data)],
            )
        return self._one(f"SELECT {_FILE_META} FROM files WHERE id = ?", [file_id])  # type: ignore[return-value]

    def get_file(self, file_id: str) -> dict | None:
        """Metadata plus `data` (bytes)."""
        return self._one(f"SELECT {_FILE_META}, data FROM files WHERE id = ?", [file_id])

    def list_files(self, conversation_id: str) -> list[dict]:
        """Metadata (no data) of a conversation's files, oldest first."""
        return self._all(
            f"SELECT {_FILE_META} FROM files WHERE conversation_id = ? ORDER BY created_at, rowid", [conversation_id]
        )
