"""No tool descendant outlives its owner: real processes, real clock.

`tests/support/tool_owner.py` plays the runner (a subreaper that runs one shell
tool and sweeps) and the host (a subreaper above it that sweeps after the
runner exits). Each child the command leaves behind runs `sleep 300.<n>` with a
unique <n>, so /proc tells whether it still lives. After the tool ends, is
cancelled, or its runner is SIGKILLed, every marker must be gone within 2 s.
The default run starts all five kinds of child in one command per case; the
slow run checks each kind alone.

Each case runs twice: with the tool in a PID namespace of its own (where this
machine allows one: then a SIGKILLed runner needs no host sweep at all, the
kernel ends the namespace) and with namespaces turned off
(`OMNIGENT_TOOL_PIDNS=0`: the subreaper sweeps alone).
"""

from __future__ import annotations

import itertools
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from omnigent.tools.shell import PIDNS_VAR, namespace_argv
from tests.support.tool_owner import kinds as _kinds
from tests.support.tool_owner import markers_alive as _markers_alive

_HAS_PIDNS = bool(namespace_argv())
ISOLATIONS = [pytest.param("pidns", marks=pytest.mark.skipif(not _HAS_PIDNS, reason="no user+PID namespaces here")),
              "sweeps"]


def _env(isolation: str) -> dict[str, str]:
    return {**os.environ, PIDNS_VAR: "1" if isolation == "pidns" else "0"}

OWNER = Path(__file__).resolve().parents[1] / "support" / "tool_owner.py"
_numbers = itertools.count(int(time.time() * 1000) % 100000 * 100)


def _wait_started(marker: str, count: int, within: float = 10.0) -> None:
    """Until `count` marked processes run: "ready" is printed before the last ones exec."""
    deadline = time.monotonic() + within
    while len(_markers_alive(marker)) < count:
        assert time.monotonic() < deadline, f"only {_markers_alive(marker)} of {count} started"
        time.sleep(0.005)


def _wait_gone(marker: str, within: float) -> list[int]:
    deadline = time.monotonic() + within
    while (alive := _markers_alive(marker)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return alive


class _Owner:
    """A tool_owner.py process and its output lines, read with deadlines."""

    def __init__(self, role: str, workspace: Path, mode: str, command: str, env: dict | None = None) -> None:
        self.proc = subprocess.Popen([sys.executable, str(OWNER), role, str(workspace), mode, command],
                                     stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
        self.lines: list[str] = []
        self._buffer = b""

    def expect(self, prefix: str, timeout: float = 15.0) -> str:
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                for line in self.lines:
                    if line.startswith(prefix):
                        return line
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {prefix!r} line; got {self.lines}")
                if sel.select(left):
                    data = os.read(fd, 65536)
                    if not data:
                        raise AssertionError(f"owner exited before {prefix!r}; got {self.lines}")
                    self._buffer += data
                    *done, self._buffer = self._buffer.split(b"\n")
                    self.lines.extend(d.decode() for d in done)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _cleanup(marker: str) -> None:
    for pid in _markers_alive(marker):  # only the processes this test started (unique marker)
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _run_case(tmp_path: Path, case: str, spawn: str, isolation: str = "sweeps") -> None:
    marker = str(next(_numbers))
    spawn = spawn.replace("MARKER", marker)
    owners: list[_Owner] = []
    env = _env(isolation)
    try:
        if case == "end":
            command = f"{spawn} echo ready"
            runner = _Owner("runner", tmp_path, "end", command, env=env)
            owners.append(runner)
            runner.expect("SWEPT")
            assert json.loads(runner.expect("OUTCOME").split(" ", 1)[1])[0] == "completed"
        elif case == "cancel":
            command = f"{spawn} echo ready; exec sleep 300.{marker}9"
            runner = _Owner("runner", tmp_path, "cancel", command, env=env)
            owners.append(runner)
            runner.expect("SWEPT")
        elif isolation == "pidns":  # the runner SIGKILLed mid-tool, and no host above it sweeps
            command = f"{spawn} echo ready; exec sleep 300.{marker}9"
            runner = _Owner("runner", tmp_path, "hang", command, env=env)
            owners.append(runner)
            runner_pid = int(runner.expect("RUNNER").split()[1])
            runner.expect("READY")
            _wait_started(marker, command.count("sleep 300."))
            os.kill(runner_pid, signal.SIGKILL)
        else:  # the runner SIGKILLed mid-tool; the host sweeps
            command = f"{spawn} echo ready; exec sleep 300.{marker}9"
            host = _Owner("host", tmp_path, "hang", command, env=env)
            owners.append(host)
            runner_pid = int(host.expect("RUNNER").split()[1])
            host.expect("READY")
            _wait_started(marker, command.count("sleep 300."))  # the children really started
            os.kill(runner_pid, signal.SIGKILL)
            host.expect("SWEPT")
        assert _wait_gone(marker, 2.0) == []
    finally:
        for owner in owners:
            owner.close()
        _cleanup(marker)


def _all_kinds() -> str:
    return " ".join(_kinds("MARKER").values())


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("case", ["end", "cancel", "runner_killed"])
def test_no_descendant_outlives_the_tool(tmp_path, case, isolation):
    _run_case(tmp_path, case, _all_kinds(), isolation)


@pytest.mark.slow
@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("case", ["end", "cancel", "runner_killed"])
@pytest.mark.parametrize("kind", list(_kinds("MARKER")))
def test_each_kind_of_child_alone(tmp_path, case, kind, isolation):
    _run_case(tmp_path, case, _kinds("MARKER")[kind], isolation)


def test_the_sweep_leaves_children_it_must_keep(tmp_path):
    """The host's narrowed sweep never touches a child that is not an orphaned tool process."""
    from omnigent.tools.reaper import orphaned_tools, sweep_orphans

    keep = subprocess.Popen(["sleep", "30"])
    mine = subprocess.Popen(["sleep", "30"], env={**os.environ, "OMNIGENT_TOOL_OWNER": str(os.getpid())})
    try:
        assert sweep_orphans(keep=(), select=orphaned_tools(alive={os.getpid()})) == []
        assert keep.poll() is None and mine.poll() is None
        # `keep` wins over `select` (an unnarrowed sweep would take this test process's other children)
        ours = {keep.pid, mine.pid}
        assert sweep_orphans(keep={keep.pid}, select=ours.__contains__) == [mine.pid]
        assert keep.poll() is None and not Path(f"/proc/{mine.pid}").exists()
    finally:
        for proc in (keep, mine):
            try:
                proc.kill()
                proc.wait()
            except (ProcessLookupError, ChildProcessError):
                pass


def test_the_markers_do_outlive_a_plain_bash(tmp_path):
    """The control: without the tools' machinery the same children do survive their bash."""
    marker = str(next(_numbers))
    try:
        subprocess.run(["bash", "-c", _all_kinds().replace("MARKER", marker) + " true"],
                       stdin=subprocess.DEVNULL, timeout=10, check=True)
        deadline = time.monotonic() + 5
        while len(_markers_alive(marker)) < 6 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(_markers_alive(marker)) == 6
    finally:
        _cleanup(marker)


def test_the_bash_dies_with_its_runner_even_without_a_sweep(tmp_path):
    """PR_SET_PDEATHSIG alone: no host above; SIGKILL the runner, its tool's bash goes too."""
    marker = str(next(_numbers))
    runner = _Owner("runner", tmp_path, "hang", f"echo ready; exec sleep 300.{marker}9", env=_env("sweeps"))
    try:
        pid = int(runner.expect("RUNNER").split()[1])
        runner.expect("READY")
        _wait_started(marker, 1)
        os.kill(pid, signal.SIGKILL)
        assert _wait_gone(marker, 2.0) == []
    finally:
        runner.close()
        _cleanup(marker)


@pytest.mark.slow
async def test_a_long_tool_is_not_killed_when_a_worker_thread_idles_out(tmp_path):
    """The parent-death signal follows the forking thread: trio's idle worker threads exit after
    about 10 s, which must not kill a tool (we fork from the trio thread)."""
    import trio

    from omnigent.tools import ToolContext, run_tool

    await trio.to_thread.run_sync(lambda: None)  # a worker thread exists, and will idle out
    ctx = ToolContext(str(tmp_path), 60.0, dict(os.environ), [])
    outcome = await run_tool("shell", json.dumps({"command": "sleep 12; echo survived"}), ctx)
    assert outcome.output == "survived\nexit code: 0"


def test_the_tool_sees_no_credential_of_its_runner(tmp_path):
    """`env` and `cat /proc/$PPID/environ` (the runner's own environment) show no secret value."""
    secrets = {"OMNIGENT_RUNNER_TOKEN": "rt-" + "a1b2c3d4" * 4, "OPENAI_API_KEY": "sk-" + "e5f6a7b8" * 4,
               "OMNIGENT_HOST_SECRET": "hs-" + "c9d0e1f2" * 4, "GITHUB_TOKEN": "ghp_" + "1a2b3c4d" * 4}
    (tmp_path / "leak.txt").write_text(secrets["GITHUB_TOKEN"])
    command = ("env; echo ---; tr '\\0' '\\n' < /proc/$PPID/environ; echo ---; cat leak.txt; echo; echo ready")
    runner = _Owner("runner", tmp_path, "end", command, env={**_env("sweeps"), **secrets})  # reads its parent
    try:
        status, output = json.loads(runner.expect("OUTCOME").split(" ", 1)[1])
        assert status == "completed"
        assert "OMNIGENT_RUNNER_TOKEN=[redacted]" in output  # the parent's environ was read ...
        for name, value in secrets.items():
            assert value not in output                       # ... and no value got through
            assert f"\n{name}=" not in output.split("---")[0]  # the tool's own env has none of them
        assert output.split("---")[2].split() == ["[redacted]", "ready", "exit", "code:", "0"]
    finally:
        runner.close()
