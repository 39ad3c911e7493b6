"""What the REPL's status line says: the state, how long the turn has run, its tokens.

Only the text lives here (pure, clock passed in); `console.Console` decides
where it is drawn and redraws it in place. The words are the readiness
markers tests wait for: `state: running` while a turn runs, `state: sleeping`
while input is being read, and never anything else that could be mistaken for
them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def total_tokens(usage: Any) -> int | None:
    """The total of a Responses or Chat Completions usage dict (None when it says nothing)."""
    if not isinstance(usage, dict):
        return None
    numbers = {k: v for k, v in usage.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if "total_tokens" in numbers:
        return int(numbers["total_tokens"])
    parts = [numbers[k] for k in ("input_tokens", "output_tokens", "prompt_tokens", "completion_tokens")
             if k in numbers]
    return int(sum(parts)) if parts else None


def elapsed(seconds: float) -> str:
    """`4 s`, `1 min 05 s`, `2 h 03 min`: whole seconds, so the line changes once a second at most."""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


@dataclass
class Status:
    """The state of the attached conversation as this terminal shows it."""

    started: float | None = None   # trio time the running turn started; None: no turn runs
    tokens: int | None = None      # the running turn's tokens so far (or the last turn's)
    last: str | None = None        # "12 s · 876 tokens" of the last turn, shown while sleeping

    @property
    def running(self) -> bool:
        return self.started is not None

    def start(self, now: float) -> None:
        self.started, self.tokens = now, None

    def stop(self, now: float) -> None:
        if self.started is None:
            return
        parts = [elapsed(now - self.started)]
        if self.tokens is not None:
            parts.append(f"{self.tokens:,} tokens")
        self.last = " · ".join(parts)
        self.started = None

    def text(self, now: float) -> str:
        """`state: running · 4 s · 812 tokens`, or `state: sleeping · last turn 12 s · 876 tokens`."""
        if self.started is not None:
            parts = ["state: running", elapsed(now - self.started)]
            if self.tokens is not None:
                parts.append(f"{self.tokens:,} tokens")
            return " · ".join(parts)
        return "state: sleeping" + (f" · last turn {self.last}" if self.last else "")
