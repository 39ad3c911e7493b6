"""Recovery timing knobs, from the environment, checked before anything starts.

Defaults catch a hung runner within ~6 s, let a turn cost up to
5 runners (lost mid-turn) before it fails with `runner_lost`, let a message
wait 30 s for a runner and an approval 10 min for an answer. Tests and
unusual deployments (slow machines, long model calls that block a runner's
loop) change them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Tuning:
    ping_interval: float = 1.0   # seconds between pings to a runner
    # pings' worth of silence before a runner counts as hung: a busy runner on a loaded 2-core
    # machine was measured silent for up to ~1 s (scripts/bench_pings.py), 6.4 s before the
    # openai SDK's request building moved off its loop; the old 3 s killed live runners
    ping_allowance: float = 6.0
    turn_losses: int = 5         # runners a turn may lose (mid-turn) before it fails: runner_lost
    runner_wait: float = 30.0    # how long a message waits for a runner to come online
    host_grace: float = 10.0     # how long a host whose link dropped has to come back
    # `omnigent server` after a restart: how long a turn that was running waits for its
    # runner to reconnect and claim it before it is dispatched again
    adopt_grace: float = 10.0
    runner_idle_timeout: float = 3600.0  # a daemon's runner nobody uses ends after this long
    # how long an approval waits for an answer when the message did not say (a session driven
    # through the API); then the call counts as not approved
    approval_timeout: float = 600.0


_VARS = {
    "OMNIGENT_PING_INTERVAL": ("ping_interval", float),
    "OMNIGENT_PING_ALLOWANCE": ("ping_allowance", float),
    "OMNIGENT_TURN_LOSSES": ("turn_losses", int),
    "OMNIGENT_RUNNER_WAIT": ("runner_wait", float),
    "OMNIGENT_HOST_GRACE": ("host_grace", float),
    "OMNIGENT_ADOPT_GRACE": ("adopt_grace", float),
    "OMNIGENT_RUNNER_IDLE_TIMEOUT": ("runner_idle_timeout", float),
    "OMNIGENT_APPROVAL_TIMEOUT": ("approval_timeout", float),
}


def tuning_from_env(environ: Mapping[str, str] = os.environ) -> Tuning:
    """Raises ValueError with a one-line message naming the variable."""
    values = {}
    for var, (field, kind) in _VARS.items():
        raw = environ.get(var)
        if raw is None or raw == "":
            continue
        try:
            value = kind(raw)
        except ValueError:
            raise ValueError(f"{var} must be a {'whole ' if kind is int else ''}number, not {raw!r}") from None
        if not math.isfinite(value):
            raise ValueError(f"{var} must be a finite number, not {raw!r}")
        if value <= 0:
            raise ValueError(f"{var} must be greater than 0, not {raw!r}")
        values[field] = value
    return Tuning(**values)
