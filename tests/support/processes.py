"""Server processes a test starts: started with their URL read from their first line, always stopped."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping


def stop(proc: subprocess.Popen, timeout: float = 15) -> None:
    """SIGTERM, a bounded wait, then SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def omnigent_server(env: Mapping[str, str], *args: str) -> Iterator[str]:
    """`omnigent server ARGS` running; yields its URL (from the line it prints once listening)."""
    proc = subprocess.Popen([sys.executable, "-m", "omnigent", "server", *args], env=dict(env),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            text=True)
    try:
        line = proc.stdout.readline()
        assert "listening on " in line, line
        yield line.split("listening on ")[1].split()[0]
    finally:
        stop(proc)
