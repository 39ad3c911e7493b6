"""Self-healing as a REPL user sees it: real runners SIGKILLed under a real PTY.

Includes the port of the original's `test_repl_recover_after_runner_death`
to the local `omnigent run` (the runner pid comes from the host log line),
keeping its assertions: the next prompt gets the marker, the session's runner
id changes, the new runner is online. The tree's API requires the client
token it keeps in memory, so an outside client at the URL the server logged
is refused; the binding is read from the store and "online" is the bound
runner's process being alive.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import sys
from pathlib import Path

import httpx
import pexpect

from tests.conftest import configure_mock_llm
from tests.e2e._pexpect_harness import PROMPT_READY, STATE_SLEEPING, clean_exit, submit_prompt
from tests.e2e._repl_helpers import agent_env, new_model, release_gates, run_args, wait_for_gate, write_agent

READY = [STATE_SLEEPING, PROMPT_READY]


def host_log(home: Path) -> str:
    return "".join(p.read_text() for p in (home / ".omnigent" / "logs" / "host").glob("*.log"))


def server_url(home: Path) -> str:
    return re.search(r"Running on (http://127\.0\.0\.1:\d+)", host_log(home)).group(1)


def runner_pid(home: Path, runner_id: str) -> int:
    found = re.findall(rf"Launched runner {re.escape(runner_id)}\b.*?\(pid=(\d+)\)", host_log(home))
    assert found, f"no launch line for {runner_id}"
    return int(found[-1])


def spawn(agent: Path, env: dict[str, str]) -> pexpect.spawn:
    env = {**env, "OMNIGENT_SESSIONS_ADAPTER_DEBUG": "1", "LINES": "40", "COLUMNS": "120"}
    return pexpect.spawn(sys.executable, run_args(agent), env=env, encoding="utf-8",
                         codec_errors="replace", timeout=60, dimensions=(40, 120))


def first_turn(child: pexpect.spawn, mock_url: str, model: str, marker: str) -> tuple[str, str]:
    configure_mock_llm(mock_url, [{"text": marker}], key=model)
    child.expect(READY, timeout=60)
    submit_prompt(child, "respond with the configured marker")
    child.expect(r"session created id='([^']+)'")
    session_id = child.match.group(1)
    child.expect(r"runner bound id='([^']+)'")
    runner_id = child.match.group(1)
    child.expect(re.escape(marker))
    child.expect(READY)
    return session_id, runner_id


def session_runner(home: Path, url: str, session_id: str) -> tuple[str, bool]:
    refused = httpx.get(f"{url}/v1/sessions/{session_id}", timeout=5)
    assert refused.status_code == 401  # not without the tree's own token
    with sqlite3.connect(home / ".omnigent" / "chat.db") as db:
        (runner_id,) = db.execute("SELECT runner_id FROM conversations WHERE id = ?", (session_id,)).fetchone()
    return runner_id, _alive(runner_pid(home, runner_id))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_repl_recover_after_runner_death(mock_credentials_env, mock_llm_server_url, tmp_path):
    home = tmp_path / "home"
    model = new_model()
    agent = write_agent(tmp_path, model)
    child = spawn(agent, agent_env(mock_credentials_env, home))
    try:
        session_id, first_runner = first_turn(child, mock_llm_server_url, model, "SESSION_RECOVER_OK")
        os.kill(runner_pid(home, first_runner), signal.SIGKILL)
        # repaired before the next prompt: one notice line, then the prompt again
        child.expect(r"runner runner_\w+… died \(SIGKILL\); replaced by runner_\w+… in \d+\.\d\d s")
        child.expect(READY)
        url = server_url(home)
        recovered, online = session_runner(home, url, session_id)
        assert recovered != first_runner and online
        configure_mock_llm(mock_llm_server_url, [{"text": "SESSION_RECOVER_OK"}], key=model)
        submit_prompt(child, "respond with the configured marker again")
        child.expect(re.escape("SESSION_RECOVER_OK"))
        child.expect(READY)
        assert session_runner(home, url, session_id) == (recovered, True)
        clean_exit(child, timeout=20)
    finally:
        child.close(force=True)


def test_sigkill_mid_turn_still_answers_once(mock_credentials_env, mock_llm_server_url, tmp_path):
    home = tmp_path / "home"
    model = new_model()
    agent = write_agent(tmp_path, model)
    child = spawn(agent, agent_env(mock_credentials_env, home))
    try:
        session_id, runner = first_turn(child, mock_llm_server_url, model, "WARMED_UP")
        configure_mock_llm(mock_llm_server_url, [{"block": True, "text": "LOST_ANSWER"},
                                                 {"text": "ANSWER_AFTER_CRASH"}], key=model)
        submit_prompt(child, "a question the runner will die on")
        wait_for_gate(mock_llm_server_url, model)
        os.kill(runner_pid(home, runner), signal.SIGKILL)
        child.expect(r"died \(SIGKILL\); replaced by runner_\w+… in \d+\.\d\d s; retrying your turn")
        child.expect("ANSWER_AFTER_CRASH")
        child.expect(READY)
        release_gates(mock_llm_server_url)
        clean_exit(child, timeout=20)
        output = child.before or ""
        assert "LOST_ANSWER" not in output
        with sqlite3.connect(home / ".omnigent" / "chat.db") as db:
            answers = [r[0] for r in db.execute(
                "SELECT data FROM conversation_items WHERE conversation_id = ? AND role = 'assistant'",
                (session_id,))]
            turns = db.execute("SELECT status, attempt FROM turns WHERE conversation_id = ? "
                               "ORDER BY created_at", (session_id,)).fetchall()
        assert len(answers) == 2 and "ANSWER_AFTER_CRASH" in answers[1]  # once, not twice
        assert turns == [("completed", 1), ("completed", 2)]
    finally:
        release_gates(mock_llm_server_url)
        child.close(force=True)


def test_tree_killed_mid_turn_then_resume_shows_interrupted_and_retry_runs_it(
        mock_credentials_env, mock_llm_server_url, tmp_path):
    import subprocess

    home = tmp_path / "home"
    model = new_model()
    agent = write_agent(tmp_path, model)
    env = agent_env(mock_credentials_env, home)
    configure_mock_llm(mock_llm_server_url, [{"block": True, "text": "NEVER_SEEN"}], key=model)
    proc = subprocess.Popen([sys.executable, *run_args(agent, "-p", "the question")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_gate(mock_llm_server_url, model)
        proc.kill()  # the whole tree dies mid-turn
        proc.wait(timeout=10)
    finally:
        release_gates(mock_llm_server_url)
    configure_mock_llm(mock_llm_server_url, [{"text": "RETRIED_ANSWER"}], key=model)
    result = subprocess.run([sys.executable, *run_args(agent, "--continue")], env=env,
                            input="/retry\n/quit\n", capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "Resumed conversation" in result.stdout and "the question" in result.stdout
    assert "The last turn was interrupted" in result.stderr
    assert "RETRIED_ANSWER" in result.stdout
    with sqlite3.connect(home / ".omnigent" / "chat.db") as db:
        turns = [r[0] for r in db.execute("SELECT status FROM turns ORDER BY created_at")]
        answers = db.execute("SELECT count(*) FROM conversation_items WHERE role = 'assistant'").fetchone()
        steps = db.execute("SELECT step, kind, status FROM turn_steps").fetchall()
    # issue 9: the interrupted turn had a stored step (its model call), so /retry requeued that same
    # turn and the agent loop continued it from there (the model step asked again), once
    assert turns == ["completed"] and answers == (1,)
    assert steps == [(0, "model", "completed")]


def test_repl_reports_runners_that_cannot_stay_up(mock_credentials_env, tmp_path):
    import subprocess

    home = tmp_path / "home"
    broken = tmp_path / "broken-python"
    broken.write_text("#!/bin/sh\necho 'ModuleNotFoundError: no module named trio' >&2\nexit 3\n")
    broken.chmod(0o755)
    env = {**agent_env(mock_credentials_env, home), "OMNIGENT_RUNNER_PYTHON": str(broken)}
    result = subprocess.run([sys.executable, *run_args(write_agent(tmp_path, new_model()))], env=env,
                            input="are you there?\n", capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "Error: " in result.stderr and "Traceback" not in result.stderr
    assert "exited with code 3" in result.stderr
    assert "ModuleNotFoundError: no module named trio" in result.stderr  # the runner's log tail
    with sqlite3.connect(home / ".omnigent" / "chat.db") as db:
        assert db.execute("SELECT count(*) FROM conversation_items").fetchone() == (1,)  # kept
