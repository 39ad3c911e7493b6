"""A time limit on every test that still runs fixture teardown (a pytest plugin).

Why not pytest-timeout: its `thread` method ends the whole run with `os._exit`, so no
fixture teardown runs and every process a fixture started is left behind; its `signal`
method raises wherever the main thread is, which inside `trio.run` lands in trio's own
machinery. Here one real-time alarm (SIGALRM, `setitimer`) is armed for each phase of a
test (setup, call, teardown), and what it does depends on what is running then:

- a trio test body (pytest-trio, trio_mode): the body runs in a cancel scope that the
  alarm cancels through the run's `TrioToken`, and the test fails with a timeout; its
  fixtures are torn down as after any failure;
- trio fixtures being set up or torn down (they run in the same `trio.run`): the scope
  around the whole run is cancelled, which also tears down what was set up;
- an asyncio test body (pytest-asyncio): its `asyncio.timeout` is made to expire now;
- anything else (sync tests, pexpect e2e, sync fixtures): `Failed` is raised in the main
  thread, a BaseException that a test's `except Exception` does not swallow.

When cancelling does not end the phase within `GRACE` seconds (a blocking call inside a
loop cannot be cancelled; `OMNIGENT_TEST_GRACE`, 10 s), the alarm fires again and raises, as
for sync code.

The deadlines are in real time, never on trio's clock: a test under
`MockClock(autojump_threshold=0)` may sleep through virtual hours. The limit of a test is
`@pytest.mark.timeout(seconds)`, else `SLOW_TIMEOUT` for `slow` tests, else `DEFAULT_TIMEOUT`;
`OMNIGENT_TEST_TIMEOUT=SECONDS` changes the default and `OMNIGENT_TEST_TIMEOUT=0` turns
the limits off (for a debugger).

Registered by tests/conftest.py; `-p tests.support.timeouts` loads it alone (its own test
runs a tiny suite in a subprocess that way).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import signal
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trio

DEFAULT_TIMEOUT = 120.0
SLOW_TIMEOUT = 600.0
GRACE = float(os.environ.get("OMNIGENT_TEST_GRACE", "10"))

Failed = pytest.fail.Exception

# what the alarm does now: the innermost running guarded thing's canceller, or nothing (raise)
_cancellers: list[Callable[[], None]] = []
_phase: dict[str, Any] = {"fired": False, "what": ""}


def limit_of(item: pytest.Item) -> float:
    """The time limit of each phase of `item` in seconds; 0 means none."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        seconds = marker.kwargs.get("seconds", marker.args[0] if marker.args else None)
        if not isinstance(seconds, (int, float)) or seconds < 0:
            raise pytest.UsageError(f"{item.nodeid}: timeout(seconds) needs a number >= 0")
        return float(seconds)
    env = os.environ.get("OMNIGENT_TEST_TIMEOUT")
    if env is not None and float(env) == 0:
        return 0.0
    if item.get_closest_marker("slow") is not None:
        return SLOW_TIMEOUT
    return float(env) if env else DEFAULT_TIMEOUT


def _on_alarm(signum: int, frame: Any) -> None:
    if not _phase["fired"] and _cancellers:
        _phase["fired"] = True
        _cancellers[-1]()
        signal.setitimer(signal.ITIMER_REAL, GRACE)  # the backstop, should cancelling not end it
        return
    _phase["fired"] = True
    raise Failed(f"{_phase['what']} (and did not stop when cancelled)" if _cancellers else _phase["what"],
                 pytrace=True)


@contextmanager
def _armed(seconds: float, what: str) -> Iterator[None]:
    if seconds <= 0:
        yield
        return
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    _phase.update(fired=False, what=what)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def _guard(cancel: Callable[[], None]) -> Iterator[None]:
    _cancellers.append(cancel)
    try:
        yield
    finally:
        _cancellers.remove(cancel)


def _timed_out() -> Failed:
    return Failed(_phase["what"], pytrace=False)


def _guarded_trio_run(afn: Callable[[], Any], *, clock: Any = None, instruments: Any = ()) -> Any:
    """trio.run, with the whole run (trio fixtures and the test) cancellable by the alarm."""

    async def main() -> Any:
        token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as scope, _guard(lambda: token.run_sync_soon(scope.cancel)):
            try:
                return await afn()
            except BaseException as exc:
                # pytest-trio reports fixtures cancelled in setup as errors of theirs
                if _phase["fired"] and not isinstance(exc, Failed):
                    raise _timed_out() from exc
                raise
        if _phase["fired"]:
            raise _timed_out()

    return trio.run(main, clock=clock, instruments=list(instruments))


def _trio_body(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def body(*args: Any, **kwargs: Any) -> None:
        token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as scope:
            with _guard(lambda: token.run_sync_soon(scope.cancel)):
                try:
                    await fn(*args, **kwargs)
                except BaseException as exc:
                    if _phase["fired"] and not isinstance(exc, Failed):
                        raise _timed_out() from exc
                    raise
        if _phase["fired"]:
            raise _timed_out()

    return body


def _asyncio_body(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def body(*args: Any, **kwargs: Any) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(None) as deadline:
                with _guard(lambda: loop.call_soon_threadsafe(deadline.reschedule, loop.time())):
                    await fn(*args, **kwargs)
        except TimeoutError as exc:
            if _phase["fired"]:
                raise _timed_out() from exc
            raise

    return body


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Who runs each async test, and the wraps that make its body cancellable by the alarm.

    trio_mode marks every async test `trio`; one marked `asyncio` belongs to pytest-asyncio.
    """
    for item in items:
        if not isinstance(item, pytest.Function) or not inspect.iscoroutinefunction(item.obj):
            continue
        if item.get_closest_marker("asyncio") is not None:
            item.own_markers[:] = [m for m in item.own_markers if m.name != "trio"]
            item.obj = _asyncio_body(item.obj)
        elif item.get_closest_marker("trio") is not None:
            # pytest-trio calls the `run` of the closest trio marker that names one (trio.run)
            item.add_marker(pytest.mark.trio(run=_guarded_trio_run), append=False)
            item.obj = _trio_body(item.obj)


def _phase_wrapper(phase: str) -> Callable[[pytest.Item], Generator[None, None, None]]:
    @pytest.hookimpl(wrapper=True)
    def hook(item: pytest.Item) -> Generator[None, None, None]:
        seconds = limit_of(item)
        with _armed(seconds, f"{phase} took longer than its timeout of {seconds:g} s"):
            return (yield)

    return hook


pytest_runtest_setup = _phase_wrapper("setup")
pytest_runtest_call = _phase_wrapper("test")
pytest_runtest_teardown = _phase_wrapper("teardown")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "timeout(seconds): this test's own time limit per phase (tests/support/timeouts.py)")
