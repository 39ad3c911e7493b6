"""SIGKILL of the runner while a side-effecting tool runs, on real processes (issue 9, "A loop that survives crashes").

`omnigent run agent.yaml -p` with the mock LLM scripted to call `shell`
with `sleep 30; echo once >> f`. Once the `sleep` runs, the runner is
SIGKILLed from outside. The loop must store the call as interrupted (never
run it again), the tool's whole tree must be gone within 2 s, the file must
never be written, and the turn must be answered once, by the next model
step on the replacement runner.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path


from tests.conftest import configure_mock_llm, mock_requests
from tests.e2e.test_run_oneshot import env  # noqa: F401  (fixture)
from tests.e2e.test_run_oneshot import tagged_commands as _tagged

RUN_TIMEOUT = 60


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_sigkill_mid_shell_interrupts_the_call_kills_its_tree_and_answers_once(env, tmp_path, mock_llm_server_url):
    model = f"kill-mid-tool-{uuid.uuid4().hex[:8]}"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    agent = tmp_path / "agent.yaml"
    agent.write_text(f"name: killer\nprompt: Be brief.\nexecutor:\n  harness: openai-agents\n  model: {model}\n"
                     "tools: [shell]\npermissions: auto\n")
    command = "sleep 30; echo once >> f"
    configure_mock_llm(mock_llm_server_url, [
        {"tool_calls": [{"name": "shell", "arguments": json.dumps({"command": command}), "call_id": "call_k1"}]},
        {"text": "done after the interruption"},
    ], key=model)
    tag = env["OMNIGENT_TEST_TAG"]
    proc = subprocess.Popen([sys.executable, "-m", "omnigent", "run", str(agent), "-p", "go"], env=env,
                            cwd=workspace, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)
    try:
        _wait_for(lambda: [p for p, cmd in _tagged(tag) if cmd.startswith("sleep")], 30, "the tool's sleep")
        (runner,) = [p for p, cmd in _tagged(tag) if "omnigent.runner" in cmd]
        os.kill(runner, signal.SIGKILL)
        killed_at = time.monotonic()
        _wait_for(lambda: not [p for p, cmd in _tagged(tag) if cmd.startswith("sleep") or cmd.startswith("bash")],
                  2.0, "no sleep or bash of the killed runner's tool")
        assert time.monotonic() - killed_at <= 2.0
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "done after the interruption" in out
    assert not (workspace / "f").exists()  # the command never completed, and never ran again
    assert [p for p, _ in _tagged(tag)] == []
    assert len(mock_requests(mock_llm_server_url, key=model)) == 2  # model step 0, then the next one
    db = Path(env["HOME"]) / ".omnigent" / "chat.db"
    with sqlite3.connect(db) as conn:
        items = conn.execute("SELECT type, status, data FROM conversation_items ORDER BY position").fetchall()
        steps = conn.execute("SELECT step, kind, status FROM turn_steps ORDER BY step").fetchall()
    assert [(t, s) for t, s, _ in items] == [("message", "completed"), ("function_call", "completed"),
                                             ("function_call_output", "interrupted"), ("message", "completed")]
    assert json.loads(items[2][2])["output"].startswith("interrupted: the runner stopped while this ran")
    assert steps == [(0, "model", "completed"), (1, "tool", "interrupted"), (2, "model", "completed")]
