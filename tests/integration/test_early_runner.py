"""The CLI's early runner (`omnigent.tree.early`): adopted only by the launch it matches, never left behind.

Real processes (a runner interpreter each, ~1 s), bounded waits. The adoption
itself, end to end, is covered by every `omnigent run` e2e test (the CLI
spawns its runner this way by default).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from omnigent.tree import early
from omnigent.tree.early import EarlyLauncher, _delta


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_delta_only_identity() -> None:
    had = {"PATH": "/bin", "OPENAI_API_KEY": "k"}
    wanted = {**had, "OMNIGENT_RUNNER_ID": "runner_x", "OMNIGENT_RUNNER_TOKEN": "s",
              "OMNIGENT_SERVER_URL": "http://127.0.0.1:1", "OMNIGENT_TOOL_POLICY": "auto"}
    assert _delta(had, wanted) == {k: wanted[k] for k in wanted if k.startswith("OMNIGENT_")}
    assert _delta(had, {**wanted, "OPENAI_API_KEY": "other"}) is None  # the model's credentials changed
    assert _delta(had, {"PATH": "/bin"}) is None


def test_switched_off() -> None:
    assert early.start({**os.environ, early.SWITCH_VAR: "0"}) is None


def test_discard_kills_and_reaps() -> None:
    runner = early.start()
    assert runner is not None
    pid = runner.popen.pid
    runner.discard()
    assert runner.popen.returncode is not None
    assert not _alive(pid)
    runner.discard()  # idempotent
    early.discard_pending()


def test_not_needed_exits_by_itself() -> None:
    """Its launcher closed the identity pipe without a word (it died, or needed no runner): exit 0."""
    runner = early.start()
    assert runner is not None
    os.close(runner._identity_w)
    runner._identity_w = None
    try:
        assert runner.popen.wait(timeout=30) == 0
    finally:
        runner.adopted = False
        runner.discard()
    early.discard_pending()


async def test_other_launch_is_not_adopted(tmp_path) -> None:
    """A launch with another environment gets a fresh process; the early one is killed."""
    runner = early.start()
    assert runner is not None
    launcher = EarlyLauncher(runner)
    env = {**runner.env, "OPENAI_BASE_URL": "http://elsewhere.invalid/v1"}  # not only identity differs
    handle = await launcher.launch([sys.executable, "-c", "import sys; sys.stdin.read()"], env=env,
                                   cwd=str(tmp_path), log_path=tmp_path / "runner.log")
    try:
        assert handle.pid != runner.popen.pid
        assert runner.popen.returncode is not None  # discarded and reaped
    finally:
        handle.close_stdin()
        with trio.fail_after(10):
            await handle.wait()
    early.discard_pending()


async def test_adopted_gets_its_log(tmp_path) -> None:
    """Adopted: what it printed before goes to its log, and so does what it prints after."""
    runner = early.start({**os.environ, "OMNIGENT_RUNNER_PYTHON": sys.executable})
    assert runner is not None
    env = {**runner.env, "OMNIGENT_SERVER_URL": "http://127.0.0.1:9", "OMNIGENT_RUNNER_ID": "runner_early",
           "OMNIGENT_RUNNER_TOKEN": "secret", "OMNIGENT_TOOL_POLICY": "deny"}
    log_path = tmp_path / "runner" / "runner_early.log"
    handle = await EarlyLauncher(runner).launch(runner.argv, env=env, cwd=runner.cwd, log_path=log_path)
    try:
        assert handle.pid == runner.popen.pid
        with trio.fail_after(30):
            while "runner_early" not in (log_path.read_text() if log_path.exists() else ""):
                await trio.sleep(0.05)  # it dials the (closed) port and says so in its log
        assert oct(log_path.stat().st_mode & 0o777) == "0o600"
        assert "secret" not in log_path.read_text()
        environ = Path(f"/proc/{handle.pid}/environ").read_bytes()
        assert b"OMNIGENT_RUNNER_TOKEN" not in environ  # on a pipe, never in its initial environment
    finally:
        handle.close_stdin()  # EOF: it exits
        with trio.fail_after(10):
            code = await handle.wait()
    assert code == 0
    assert not _alive(handle.pid)
    early.discard_pending()


@pytest.fixture(autouse=True)
def _no_leftovers():
    yield
    early.discard_pending()
    leftovers = subprocess.run(["pgrep", "-P", str(os.getpid()), "-f", "omnigent.runner"],
                               check=False, capture_output=True, text=True).stdout.split()
    assert not leftovers
