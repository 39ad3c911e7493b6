"""The reaper's pieces in this process: the subreaper flag, finding children, the host's narrowed sweep."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from omnigent.host.pool import Host
from omnigent.link.memory import memory_link
from omnigent.tools import reaper


def _sleeper(**env: str) -> subprocess.Popen:
    return subprocess.Popen(["sleep", "30"], env={**os.environ, **env}, stdin=subprocess.DEVNULL)


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


def test_subreaper_flag_can_be_set_and_cleared():
    assert reaper.become_subreaper() is True
    assert reaper.become_subreaper(False) is True


def test_children_and_tool_owner():
    marked, plain = _sleeper(OMNIGENT_TOOL_OWNER="4242"), _sleeper()
    try:
        deadline = time.monotonic() + 5
        while reaper.tool_owner(marked.pid) is None and time.monotonic() < deadline:
            time.sleep(0.005)  # the environ is readable once the child has exec'd
        assert {marked.pid, plain.pid} <= set(reaper.children())
        assert reaper.tool_owner(marked.pid) == 4242
        assert reaper.tool_owner(plain.pid) is None
        assert reaper.orphaned_tools(alive={1})(marked.pid) is True
        assert reaper.orphaned_tools(alive={4242})(marked.pid) is False
    finally:
        for proc in (marked, plain):
            proc.kill()
            proc.wait()


def test_the_pool_sweeps_only_tools_of_runners_that_ended(tmp_path):
    """Host._sweep_tools (called on every runner exit): a tool process of a dead runner goes; one of a
    live runner and a child of the pool's process that is no tool stay."""
    _server_end, host_end = memory_link()
    host = Host("http://127.0.0.1:1", host_end, log_dir=tmp_path, workspace=str(tmp_path), runners=0, env={})
    live_runner = _sleeper()
    host._pids["runner_live"] = live_runner.pid
    orphan = _sleeper(OMNIGENT_TOOL_OWNER="999999999")
    of_live = _sleeper(OMNIGENT_TOOL_OWNER=str(live_runner.pid))
    other = _sleeper()
    procs = (live_runner, orphan, of_live, other)
    try:
        deadline = time.monotonic() + 5
        while any(reaper.tool_owner(p.pid) is None for p in (orphan, of_live)) and time.monotonic() < deadline:
            time.sleep(0.005)
        host._sweep_tools()
        assert _gone(orphan.pid)  # killed and reaped: not even a zombie
        assert all(p.poll() is None for p in (live_runner, of_live, other))
    finally:
        for proc in procs:
            try:
                proc.kill()
                proc.wait()
            except (ProcessLookupError, ChildProcessError):
                pass


def test_a_sweep_looks_again_for_a_child_one_scan_missed(monkeypatch):
    """/proc/PID/task/TID/children may miss a child while children change: after killing, the
    sweep scans once more, so an orphan handed to us meanwhile is still killed."""
    from omnigent.tools import reaper

    scans = iter([[10], [], [11], [], [], []])  # 11 (10's child) missed by the scan after 10's kill
    killed: list[int] = []
    monkeypatch.setattr(reaper, "children", lambda pid=None: next(scans, []))
    monkeypatch.setattr(reaper, "_kill", lambda pid, keep: killed.append(pid))
    monkeypatch.setattr(reaper, "_reap", lambda pid: pid in killed)
    monkeypatch.setattr(reaper.time, "sleep", lambda s: None)
    assert reaper.sweep_orphans(keep=()) == [10, 11]
    assert killed == [10, 11]


def test_the_narrowed_sweep_waits_for_a_child_in_the_middle_of_its_exit(monkeypatch):
    """A tool's bash dying with its SIGKILLed runner reads as no tool's (its memory, environment
    included, is released first) while it still holds the `nohup cmd &` it hands over last: the
    host's sweep must neither judge it then nor end before the hand-over. (Seen in the slow leg:
    the nohup'd child of a killed runner outlived the host.)"""
    from omnigent.tools import reaper

    # 10: the bash, exiting for two scans, then a zombie; 11: its child, ours from the third scan
    scans = iter([[10], [10], [10, 11], [10], [10], [10]])
    exiting = iter([True, True])
    killed: list[int] = []
    judged: list[int] = []

    def select(pid: int) -> bool:
        judged.append(pid)
        return pid == 11  # the zombie bash's environment reads empty: no tool's

    monkeypatch.setattr(reaper, "children", lambda pid=None: next(scans, [10]))
    monkeypatch.setattr(reaper, "_exiting", lambda pid: pid == 10 and next(exiting, False))
    monkeypatch.setattr(reaper, "_kill", lambda pid, keep: killed.append(pid))
    monkeypatch.setattr(reaper, "_reap", lambda pid: pid in killed)
    monkeypatch.setattr(reaper.time, "sleep", lambda s: None)
    assert reaper.sweep_orphans(keep=(), select=select) == [11]
    assert killed == [11]
    assert judged == [10, 11]  # the bash once, when it was a zombie


def test_a_process_in_the_middle_of_its_exit_is_told_from_a_live_one_and_a_zombie():
    live = _sleeper()
    try:
        assert reaper._exiting(live.pid) is False
        live.kill()
        deadline = time.monotonic() + 5
        while (reaper._stat(live.pid) or [b"Z"])[0] != b"Z" and time.monotonic() < deadline:
            time.sleep(0.005)
        assert reaper._exiting(live.pid) is False  # a zombie: its children were handed on
    finally:
        live.kill()
        live.wait()
    assert reaper._exiting(live.pid) is False  # gone
