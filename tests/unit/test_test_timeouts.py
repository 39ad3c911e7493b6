"""The per-test time limit (tests/support/timeouts.py) fails a hanging test and still tears
its fixtures down, so the process a fixture started is gone when the run ends.

A tiny suite runs in a pytest subprocess with only that plugin: a hanging sync test, trio
test, asyncio test and trio fixture, each holding a child process; a test sleeping through
virtual hours under an autojump clock (it must pass: the limit is in real time).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

TINY_SUITE = '''
import asyncio, os, subprocess, sys, time
from pathlib import Path

import pytest
import trio

PIDS = Path(os.environ["TIMEOUT_TEST_PIDS"])
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def record(pid):
    with PIDS.open("a") as f:
        f.write(f"{pid}\\n")


@pytest.fixture
def sync_child():
    proc = subprocess.Popen(SLEEPER)
    record(proc.pid)
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
async def trio_child():
    proc = await trio.lowlevel.open_process(SLEEPER)
    record(proc.pid)
    try:
        yield proc
    finally:
        proc.kill()
        with trio.CancelScope(shield=True):
            await proc.wait()


@pytest.fixture
async def trio_setup_hangs():
    proc = await trio.lowlevel.open_process(SLEEPER)
    record(proc.pid)
    try:
        await trio.sleep_forever()
        yield proc
    finally:
        proc.kill()
        with trio.CancelScope(shield=True):
            await proc.wait()


@pytest.mark.timeout(0.5)
def test_sync_hangs(sync_child):
    time.sleep(600)


@pytest.mark.timeout(0.5)
def test_sync_swallows_exceptions(sync_child):
    while True:
        try:
            time.sleep(600)
        except Exception:
            pass


@pytest.mark.timeout(0.5)
async def test_trio_hangs(trio_child):
    await trio.sleep_forever()


@pytest.mark.timeout(0.5)
async def test_trio_fixture_hangs(trio_setup_hangs):
    pass


@pytest.mark.timeout(0.5)
async def test_trio_blocks_the_loop(trio_child):
    time.sleep(600)  # cannot be cancelled: the backstop raises


@pytest.mark.asyncio
@pytest.mark.timeout(0.5)
async def test_asyncio_hangs(sync_child):
    await asyncio.sleep(600)


@pytest.mark.timeout(0.5)
async def test_virtual_hours_pass(autojump_clock, trio_child):
    await trio.sleep(3600)


def test_default_limit_passes(sync_child):
    assert sync_child.poll() is None
'''

HANGING = ["test_sync_hangs", "test_sync_swallows_exceptions", "test_trio_hangs",
           "test_trio_fixture_hangs", "test_trio_blocks_the_loop", "test_asyncio_hangs"]
PASSING = ["test_virtual_hours_pass", "test_default_limit_passes"]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited (stack-notes G15)


@pytest.mark.slow  # out of the default run to keep it under 5 minutes; .ci/run runs it
def test_a_hanging_test_fails_on_time_and_its_processes_are_gone(tmp_path: Path) -> None:
    (tmp_path / "test_tiny.py").write_text(TINY_SUITE)
    (tmp_path / "pytest.ini").write_text(textwrap.dedent("""\
        [pytest]
        trio_mode = true
        asyncio_default_fixture_loop_scope = function
        markers = asyncio
    """))
    pids_file = tmp_path / "pids"
    env = {**os.environ, "TIMEOUT_TEST_PIDS": str(pids_file), "OMNIGENT_TEST_GRACE": "0.5", "COLUMNS": "300",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("OMNIGENT_TEST_TIMEOUT", None)
    try:
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "tests.support.timeouts", "-p", "no:cacheprovider",
             "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), "-rA", "-q", "--tb=no",
             str(tmp_path / "test_tiny.py")],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90, check=False)
        out = run.stdout + run.stderr
        summary = [line for line in out.splitlines() if line.startswith(("PASSED ", "FAILED ", "ERROR "))]
        for name in HANGING:
            line = next((s for s in summary if f"::{name}" in s), None)
            assert line is not None and line.startswith("FAILED ") and "timeout of 0.5 s" in line, (name, out)
        for name in PASSING:
            assert f"PASSED test_tiny.py::{name}" in summary, (name, out)
        pids = [int(p) for p in pids_file.read_text().split()]
        assert len(pids) == len(HANGING) + len(PASSING)
        assert [pid for pid in pids if _alive(pid)] == []
    finally:
        for pid in (int(p) for p in pids_file.read_text().split()) if pids_file.exists() else ():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
