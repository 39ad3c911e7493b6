"""Retrying a model call that failed for a transient reason, before any output.

Why it exists: one 429 or 500 from a provider used to fail the turn (and a
`-p` script with it). This is the one visible retry policy of a model call:
the openai client's own retries stay off (`max_retries=0`), the server's turn
attempts are for lost runners, and a successful attempt is exactly one call.

What it guarantees:
- Only transient failures are retried (the caller's `classify` decides: the
  harness says 408/409/429/5xx, connection resets and timeouts), and only
  while nothing of the answer has been emitted yet: an error after output
  has begun is final, so no user ever sees an answer start twice.
- At most `attempts` calls, all started within `window` seconds of the first;
  exponential backoff with jitter, or the server's `Retry-After` when it sent
  one (a Retry-After beyond the window is not waited for).
- Every retry is announced (`notify`) before its sleep, so it shows as one line.
- All waiting is on trio's clock, so the policy runs under `MockClock`.

Settings come from the environment (`OMNIGENT_MODEL_ATTEMPTS`,
`OMNIGENT_MODEL_RETRY_WINDOW`). `omnigent run`/`server` check them at start
with `policy_from_env` and the runner reads them per turn. This module imports
no openai, so the CLI's check costs nothing.
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import trio

T = TypeVar("T")

ATTEMPTS_VAR = "OMNIGENT_MODEL_ATTEMPTS"
WINDOW_VAR = "OMNIGENT_MODEL_RETRY_WINDOW"


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 3       # model calls per turn at most (1 = never retry)
    window: float = 20.0    # seconds after the first call within which retries may start
    base_delay: float = 1.0  # backoff before the 2nd call; doubles per retry
    max_delay: float = 8.0   # backoff cap per sleep

    def backoff(self, retry: int, rng: random.Random) -> float:
        """Sleep before retry number `retry` (1-based): base * 2**(retry-1), capped, jittered to 50-100 %."""
        delay = min(self.max_delay, self.base_delay * 2 ** (retry - 1))
        return delay * rng.uniform(0.5, 1.0)


def policy_from_env(environ: Mapping[str, str] = os.environ) -> RetryPolicy:
    """The policy the environment asks for; ValueError with one line naming the variable."""
    values: dict[str, float | int] = {}
    raw = environ.get(ATTEMPTS_VAR)
    if raw:
        try:
            attempts = int(raw)
        except ValueError:
            raise ValueError(f"{ATTEMPTS_VAR} must be a whole number, not {raw!r}") from None
        if attempts < 1:
            raise ValueError(f"{ATTEMPTS_VAR} must be at least 1, not {raw!r}")
        values["attempts"] = attempts
    raw = environ.get(WINDOW_VAR)
    if raw:
        try:
            window = float(raw)
        except ValueError:
            raise ValueError(f"{WINDOW_VAR} must be a number of seconds, not {raw!r}") from None
        if not window >= 0 or window == float("inf"):
            raise ValueError(f"{WINDOW_VAR} must be 0 or more seconds, not {raw!r}")
        values["window"] = window
    return RetryPolicy(**values)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Transient:
    """Why a failed call may be tried again: `reason` is what the retry line says."""

    reason: str                      # e.g. "model error 429 (rate limited)"
    retry_after: float | None = None  # seconds the server asked us to wait


@dataclass(frozen=True)
class Retrying:
    """One announced retry: the next call is `attempt` of `attempts`, after `delay` seconds."""

    reason: str
    attempt: int
    attempts: int
    delay: float


class GaveUp(Exception):
    """The last error, with a note on why it was not (or no more) retried; `__cause__` is the error."""

    def __init__(self, error: BaseException, note: str) -> None:
        super().__init__(note)
        self.error = error
        self.note = note


@functools.cache
def _jitter() -> random.Random:
    """The process's generator for backoff jitter, made at its first retry: seeding one (from
    os.urandom) for every model call was ~3 % of a runner's CPU a turn, for a retry that is rare."""
    return random.Random()


async def call_with_retries(
    call: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    classify: Callable[[BaseException], Transient | None],
    output_started: Callable[[], bool],
    notify: Callable[[Retrying], Awaitable[None]],
    rng: random.Random | None = None,
) -> T:
    """Run `call` until it returns, retrying transient failures that came before any output.

    A non-transient error, or any error once `output_started()` is true,
    propagates unchanged. A transient error that is not retried any more
    (attempts or window used up) raises `GaveUp` with a note for the user.
    """
    start = trio.current_time()
    attempt = 1
    while True:
        try:
            return await call()
        except Exception as exc:
            transient = classify(exc)
            if transient is None or output_started():
                raise
            if attempt >= policy.attempts:
                if policy.attempts == 1:
                    raise
                raise GaveUp(exc, f"gave up after {attempt} attempts") from exc
            remaining = start + policy.window - trio.current_time()
            if transient.retry_after is not None:
                delay = max(0.0, transient.retry_after)
                if delay > remaining:
                    raise GaveUp(exc, f"the server asked to retry after {delay:g} s, beyond the "
                                      f"{policy.window:g} s retry window") from exc
            else:
                delay = policy.backoff(attempt, rng or _jitter())
                if remaining <= 0:
                    raise GaveUp(exc, f"gave up after {attempt} attempts in the {policy.window:g} s "
                                      f"retry window") from exc
                delay = min(delay, remaining)
            attempt += 1
            await notify(Retrying(transient.reason, attempt, policy.attempts, round(delay, 3)))
            await trio.sleep(delay)
