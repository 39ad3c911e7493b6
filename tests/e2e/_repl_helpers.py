"""What the REPL e2e tests share: an isolated HOME, an agent with its own mock queue, the store."""

from __future__ import annotations

import sqlite3
import time
import uuid
from pathlib import Path

import httpx

RUN_TIMEOUT = 60


def new_model() -> str:
    """A model name of its own, so the mock's queue and captured requests are this test's alone."""
    return f"mock-repl-{uuid.uuid4().hex[:8]}"


def agent_env(base_env: dict[str, str], home: Path) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    return {**base_env, "HOME": str(home), "TERM": "xterm-256color"}


def write_agent(tmp_path: Path, model: str) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(f"name: repl_e2e\nprompt: Be brief.\nexecutor:\n  model: {model}\n")
    return path


def run_args(agent: Path, *flags: str) -> list[str]:
    return ["-m", "omnigent", "run", str(agent), *flags]


def conversation_ids(home: Path) -> list[str]:
    """Top-level conversations, oldest first."""
    with sqlite3.connect(home / ".omnigent" / "chat.db") as db:
        return [r[0] for r in db.execute("SELECT id FROM conversations WHERE kind = 1 ORDER BY created_at")]


def turn_statuses(home: Path) -> list[str]:
    with sqlite3.connect(home / ".omnigent" / "chat.db") as db:
        return [r[0] for r in db.execute("SELECT status FROM turns ORDER BY created_at")]


def wait_for_gate(mock_url: str, model: str, timeout: float = 30) -> None:
    """Until a model call of `model` is parked at a mock gate (no event to await: poll)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pending = httpx.get(f"{mock_url}/gate/pending", timeout=5).json()["pending"]
        if any(g["key"] == model for g in pending):
            return
        time.sleep(0.05)
    raise AssertionError(f"no model call of {model} reached the gate within {timeout} s")


def release_gates(mock_url: str) -> None:
    httpx.post(f"{mock_url}/gate/release", json={}, timeout=5)
