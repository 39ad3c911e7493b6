"""What the user asked `omnigent run` for, resolved by the CLI before the tree starts."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
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

    def make_front(self) -> Callable[[Any], Awaitable[int]]:
        from .front import Front  # imported late: it pulls in the HTTP client

        return Front(self).run
