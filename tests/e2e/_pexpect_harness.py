"""Driving the REPL under a real PTY, as the original's pexpect harness did."""

from __future__ import annotations

import os
from pathlib import Path

import pexpect

STATE_SLEEPING = r"state: sleeping"
PROMPT_READY = r"❯ "


def submit_prompt(child: pexpect.spawn, text: str) -> None:
    child.send(text)
    child.send("\r")


def clean_exit(child: pexpect.spawn, timeout: float) -> None:
    child.sendcontrol("d")
    try:
        child.expect(pexpect.EOF, timeout=timeout)
        return
    except pexpect.TIMEOUT:
        pass
    child.send("\x15")
    child.send("/quit\r")
    child.expect(pexpect.EOF, timeout=timeout)


def ensure_repl_test_theme_env(env: dict[str, str]) -> dict[str, str]:
    home = Path(env["HOME"])
    if home != Path(os.path.expanduser("~")):
        config = home / ".omnigent" / "config.yaml"
        if not config.exists():
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text("# Omnigent user configuration\ntui:\n  theme: light\n")
    return env
