"""`omnigent run AGENT -p TEXT` as a user runs it: answers, errors, and nothing left behind."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import configure_mock_llm, mock_requests
from tests.e2e._repl_helpers import release_gates, wait_for_gate

RUN_TIMEOUT = 60


def tagged_alive(tag: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries this test's tag."""
    return [pid for pid, _ in tagged_commands(tag)]


def tagged_commands(tag: str) -> list[tuple[int, str]]:
    """(pid, command line) of the live (non-zombie) processes whose environment carries this test's tag."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if tag.encode() not in f.read():
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                found.append((int(entry), f.read().replace(b"\0", b" ").decode(errors="replace").strip()))
        except OSError:
            continue
    return found


@pytest.fixture
def env(mock_credentials_env, tmp_path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    return {**mock_credentials_env, "HOME": str(home), "OMNIGENT_TEST_TAG": uuid.uuid4().hex}


def agent(tmp_path: Path, model: str, harness: str = "openai-agents") -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(f"name: oneshot\nprompt: Be brief.\nexecutor:\n  harness: {harness}\n  model: {model}\n")
    return path


def run(env, *args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omnigent", "run", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT, **kwargs)


@pytest.mark.parametrize("harness", ["openai-agents", "openai-chat"])
def test_prompt_prints_answer_stores_it_and_leaves_nothing(env, tmp_path, mock_llm_server_url, harness):
    model = f"oneshot-{harness}"
    configure_mock_llm(mock_llm_server_url, [{"text": "Hi there!"}], key=model)
    result = run(env, agent(tmp_path, model, harness), "-p", "Say hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Hi there!\n"
    assert tagged_alive(env["OMNIGENT_TEST_TAG"]) == []
    # exactly one model call, with the model name as given
    calls = mock_requests(mock_llm_server_url, key=model)
    assert len(calls) == 1 and calls[0]["model"] == model
    db = Path(env["HOME"]) / ".omnigent" / "chat.db"
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT id, title FROM conversations WHERE kind = 1").fetchall()
        items = conn.execute("SELECT role FROM conversation_items ORDER BY position").fetchall()
    assert len(rows) == 1 and rows[0][0].startswith("conv_") and rows[0][1] == "Say hi"
    assert items == [("user",), ("assistant",)]
    # the host logged the runner it launched, and that pid is gone
    logs = "".join(p.read_text() for p in (Path(env["HOME"]) / ".omnigent" / "logs" / "host").glob("*.log"))
    match = re.search(r"Launched runner (runner_[0-9a-f]{32}) for workspace \S+ \(pid=(\d+)\)", logs)
    assert match, logs
    runner_id, pid = match.groups()
    runner_log = Path(env["HOME"]) / ".omnigent" / "logs" / "runner" / f"{runner_id}.log"
    assert f"started pid {pid}," in runner_log.read_text()  # the real runner, not a wrapper


def test_model_error_is_one_line_exit_1(env, tmp_path, mock_llm_server_url):
    model = "oneshot-error"
    configure_mock_llm(mock_llm_server_url, [{"error": "the model is on fire", "status_code": 400}], key=model)
    result = run(env, agent(tmp_path, model), "-p", "hello?")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith("Error: ") and "the model is on fire" in result.stderr
    assert "Traceback" not in result.stderr
    assert tagged_alive(env["OMNIGENT_TEST_TAG"]) == []


def test_unreachable_endpoint_is_a_clear_error(env, tmp_path):
    env = {**env, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}  # discard port: connection refused
    result = run(env, agent(tmp_path, "m"), "-p", "hello?")
    assert result.returncode == 1
    *retries, last = result.stderr.strip().splitlines()
    # refused connections may be a server restarting: retried, one line each, then one error
    assert [line.split(";")[0] for line in retries] == ["model error: could not reach the model endpoint"] * 2
    assert last.startswith("Error: Connection error: could not reach") and last.endswith("(gave up after 3 attempts)")
    assert "Traceback" not in result.stderr
    assert tagged_alive(env["OMNIGENT_TEST_TAG"]) == []


def test_no_endpoint_configured_says_how_to_configure_one(env, tmp_path):
    env = {k: v for k, v in env.items() if not k.startswith("OPENAI_")}
    result = run(env, agent(tmp_path, "m"), "-p", "hello?")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "OPENAI_API_KEY" in lines[0] and "omnigent mock-llm" in lines[0]
    assert not (Path(env["HOME"]) / ".omnigent" / "chat.db").exists()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "no such file"),
        ("name: [unclosed\n", "not valid YAML"),
        ("prompt: hi\n", "'name'"),
        ("name: x\n", "prompt"),
        ("name: x\nprompt: hi\nexecutor:\n  harness: nope\n", "unknown harness 'nope'"),
    ],
)
def test_bad_agent_file_is_one_line_exit_1(env, tmp_path, content, needle):
    path = tmp_path / "bad.yaml"
    if content is not None:
        path.write_text(content)
    result = run(env, path, "-p", "hi")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and needle in lines[0], result.stderr
    assert "bad.yaml" in lines[0]


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_signal_mid_turn_exits_with_its_code_and_leaves_nothing(env, tmp_path, mock_llm_server_url, sig, code):
    model = f"oneshot-block-{sig.name}"
    configure_mock_llm(mock_llm_server_url, [{"block": True, "text": "never"}], key=model)
    proc = subprocess.Popen([sys.executable, "-m", "omnigent", "run", str(agent(tmp_path, model)), "-p", "wait"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_gate(mock_llm_server_url, model)
        proc.send_signal(sig)
        proc.communicate(timeout=20)
        assert proc.returncode == code
        assert tagged_alive(env["OMNIGENT_TEST_TAG"]) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        release_gates(mock_llm_server_url)


def test_sigkill_of_run_leaves_no_runner(env, tmp_path, mock_llm_server_url):
    model = "oneshot-sigkill"
    configure_mock_llm(mock_llm_server_url, [{"block": True, "text": "never"}], key=model)
    proc = subprocess.Popen([sys.executable, "-m", "omnigent", "run", str(agent(tmp_path, model)), "-p", "wait"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_gate(mock_llm_server_url, model)
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 1.0  # runners watch their stdin: EOF within 1 s
        while tagged_alive(env["OMNIGENT_TEST_TAG"]) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert tagged_alive(env["OMNIGENT_TEST_TAG"]) == []
    finally:
        release_gates(mock_llm_server_url)


def test_runner_that_cannot_start_gives_up_with_reason_and_log_tail(env, tmp_path):
    broken = tmp_path / "broken-python"
    broken.write_text("#!/bin/sh\necho 'ImportError: this environment is broken' >&2\nexit 3\n")
    broken.chmod(0o755)
    env = {**env, "OMNIGENT_RUNNER_PYTHON": str(broken)}
    result = run(env, agent(tmp_path, "m"), "-p", "keep me")
    assert result.returncode == 1
    assert result.stderr.startswith("Error: ") and "Traceback" not in result.stderr
    assert "exited with code 3" in result.stderr
    assert "ImportError: this environment is broken" in result.stderr  # the runner's log tail
    with sqlite3.connect(Path(env["HOME"]) / ".omnigent" / "chat.db") as conn:
        texts = [r[0] for r in conn.execute("SELECT data FROM conversation_items")]
        turns = conn.execute("SELECT status FROM turns").fetchall()
    assert len(texts) == 1 and "keep me" in texts[0]  # nothing lost
    assert turns == [("failed",)]
    assert tagged_alive(env["OMNIGENT_TEST_TAG"]) == []
