"""`omnigent host --permissions` with real processes: the daemon runs with it, says so, and keeps it.

A daemon already running with another policy is not restarted behind the
user's back: `omnigent host --permissions X` says what it runs with and
exits 1; `omnigent host status` shows the policy. Every daemon is stopped
in a `finally` (the `home` fixture).
"""

from __future__ import annotations

import subprocess
import sys

from omnigent.host import records
from tests.e2e.test_host_daemon import _env, home, server  # noqa: F401  (fixtures)


def _omnigent(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omnigent", *args], env=env, capture_output=True, text=True,
                          timeout=60)


def test_the_daemon_runs_with_its_permissions_and_keeps_them(server, home, mock_credentials_env):  # noqa: F811
    env = _env(mock_credentials_env, home)
    started = _omnigent(env, "host", "--server", server, "--permissions", "auto")
    assert started.returncode == 0 and "permissions auto" in started.stdout, started
    record = records.live_record(records.Paths.of(home, server))
    assert record is not None and record["permissions"] == "auto"

    status = _omnigent(env, "host", "status")
    assert status.returncode == 0 and "permissions auto" in status.stdout, status

    other = _omnigent(env, "host", "--server", server, "--permissions", "deny")
    assert other.returncode == 1, other
    assert "already runs" in other.stderr and "--permissions auto, not deny" in other.stderr
    assert len(other.stderr.strip().splitlines()) == 1
    assert records.live_record(records.Paths.of(home, server))["pid"] == record["pid"]  # not restarted

    same = _omnigent(env, "host", "--server", server, "--permissions", "auto")
    assert same.returncode == 0 and "already runs" in same.stdout

    bad = _omnigent(env, "host", "--server", server, "--permissions", "yolo")
    assert bad.returncode == 2 and "yolo" in bad.stderr
