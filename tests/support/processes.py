"""Stopping a server process a test started: SIGTERM, a bounded wait, then SIGKILL."""

from __future__ import annotations

import signal
import subprocess


def stop(proc: subprocess.Popen, timeout: float = 15) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
