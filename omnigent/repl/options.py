"""What the user asked `omnigent run` for, resolved by the CLI before the tree starts.

Plain data, importing nothing of the front end: the CLI builds it before
anything heavy is imported, and the front end and the REPL read it.
"""

from __future__ import annotations

from dataclasses import dataclass

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
