"""What the user asked `omnigent run` for, resolved by the CLI before the tree starts.

Plain data, importing nothing of the front end: the CLI builds it before
anything heavy is imported, and the front end and the REPL read it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

RESUME_PICKER = "__resume_picker__"


@dataclass
class FrontOptions:
    agent_path: str
    agent_name: str
    bundle: bytes
    prompt: str | None = None
    resume: str | None = None
    resume_latest: bool = False
    workspace: str | None = None
    ephemeral: bool = False  # --no-session: nothing survives, so no "resume with" hint
    # --server: extra fields of a created session (its host_id), and how a session gets
    # its runner (`place(client, session_id)`: reuse the bound one or ask the host for one)
    # instead of binding any online runner of the pool
    session_fields: dict[str, Any] = field(default_factory=dict)
    place: Callable[[Any, str], Awaitable[None]] | None = None
    # called when the REPL has nothing to do for a while: a turn ended, or it waits at a
    # terminal prompt (the local tree starts its warm spare then); may be called repeatedly
    idle: Callable[[], None] | None = None
    # --permission-mode ask|auto|deny: the mode of a session this run creates (or resumes)
    permission_mode: str | None = None
    # -p only: text | json | stream-json (see `repl.output`), and stdin to read as context
    output_format: str = "text"
    stdin: Any = None  # a `repl.stdin.StdinContext`, or None when stdin is not to be read
    # -v/--verbose (on `omnigent` or on `run`): say more on stderr (with -p, the conversation id)
    verbose: bool = False
    # --fork ID: the conversation to copy and open (sessions-cli); --name: the title of the
    # conversation this run creates, or of the fork
    fork: str | None = None
    title: str | None = None
    # --raw: the REPL prints answers as they are, not rendered as Markdown (see repl.console)
    raw: bool = False

    def created_fields(self) -> dict[str, Any]:
        """The metadata of a session this run creates: the workspace, --server's fields, the mode."""
        fields: dict[str, Any] = {"workspace": self.workspace, **self.session_fields}
        if self.title is not None:
            fields["title"] = self.title
        if self.permission_mode is not None:
            fields["permission_mode"] = self.permission_mode
        return fields
