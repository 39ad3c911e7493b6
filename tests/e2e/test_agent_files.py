"""Agent files as a user writes them: typos are errors, stored specs and conversations keep working."""

from __future__ import annotations

import json
import shutil
import sqlite3
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import trio

from omnigent.agents import bundle_bytes
from omnigent.client import OmnigentClient, OmnigentError
from tests.conftest import configure_mock_llm

RUN_TIMEOUT = 60
LEGACY_STORE = Path(__file__).resolve().parents[1] / "resources" / "stores" / "chat-0.1.0.db"


@pytest.fixture
def env(mock_credentials_env, tmp_path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    return {**mock_credentials_env, "HOME": str(home)}


def run(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omnigent", "run", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT)


def test_a_typo_is_one_line_naming_file_key_and_nearest_key(env, tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("name: typo\nprompt: hi\nexecutor:\n  modle: gpt-4o\n")
    result = run(env, path, "-p", "hi")
    assert result.returncode == 1
    assert result.stderr == f"Error: {path}: executor.modle: unknown key (did you mean 'model'?)\n"
    assert list(Path(env["HOME"]).iterdir()) == []


def test_a_missing_model_is_an_error_unless_given(env, tmp_path, mock_llm_server_url):
    path = tmp_path / "agent.yaml"
    path.write_text("name: nomodel\nprompt: hi\n")
    result = run(env, path, "-p", "hi")
    assert result.returncode == 1
    assert result.stderr == f"Error: {path}: 'executor.model' is missing (name the model to use, or pass --model)\n"
    model = f"given-{uuid.uuid4().hex[:8]}"
    configure_mock_llm(mock_llm_server_url, [{"text": "with --model"}], key=model)
    result = run(env, path, "-p", "hi", "--model", model)
    assert (result.returncode, result.stdout) == (0, "with --model\n"), result.stderr


@pytest.fixture
def server(env):
    proc = subprocess.Popen([sys.executable, "-m", "omnigent", "server", "--runners", "1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "listening on " in line, proc.stderr.read()
        yield line.split("listening on ")[1].split()[0]
    finally:
        proc.kill()
        proc.wait(timeout=10)


async def test_an_upload_with_a_typo_is_a_400_naming_the_key(server, tmp_path):
    path = tmp_path / "upload.yaml"
    path.write_text("name: up\nprompt: hi\nexecutor: {model: m}\ntemprature: 0.2\n")
    async with OmnigentClient(server) as client:
        with pytest.raises(OmnigentError) as info:
            await client.create_session(bundle_bytes(path))
    assert info.value.status_code == 400
    assert "upload.yaml: temprature: unknown key" in str(info.value)


def _legacy_store(env, *, unknown_keys_model: str | None = None) -> Path:
    """The store of release 0.1.0 in HOME, as loose as that release left it; optionally with one
    more agent whose stored spec has keys this release does not know, and a conversation of it."""
    data = Path(env["HOME"]) / ".omnigent"
    data.mkdir(mode=0o755)
    db = data / "chat.db"
    shutil.copyfile(LEGACY_STORE, db)
    db.chmod(0o644)
    if unknown_keys_model:
        spec = {"name": "legacy-tools", "harness": "openai-chat", "model": unknown_keys_model,
                "instructions": "Reply briefly.", "tools": ["search"], "raw": {"name": "legacy-tools",
                "prompt": "Reply briefly.", "tools": ["search"], "executor": {"model": unknown_keys_model}}}
        now = time.time()
        with sqlite3.connect(db) as conn:
            conn.execute("INSERT INTO agents (id, name, spec, created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
                         ["agent_" + "7" * 32, "legacy-tools", json.dumps(spec), now, now])
            conn.execute("INSERT INTO conversations (id, created_at, updated_at, agent_id) VALUES (?, ?, ?, ?)",
                         ["conv_" + "7" * 32, now, now, "agent_" + "7" * 32])
        conn.close()
    return db


def test_a_conversation_of_the_previous_release_continues(env, tmp_path, mock_llm_server_url):
    db = _legacy_store(env)
    path = tmp_path / "legacy-chat.yaml"
    model = f"legacy-{uuid.uuid4().hex[:8]}"
    path.write_text(f"name: legacy-chat\nprompt: Reply briefly.\nexecutor: {{harness: openai-chat, model: {model}}}\n")
    configure_mock_llm(mock_llm_server_url, [{"text": "still here"}], key=model)
    result = run(env, path, "--continue", "-p", "and now?")
    assert (result.returncode, result.stdout) == (0, "still here\n"), result.stderr
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700


async def test_a_stored_spec_with_unknown_keys_still_serves_turns(env, mock_llm_server_url):
    model = f"legacy-tools-{uuid.uuid4().hex[:8]}"
    _legacy_store(env, unknown_keys_model=model)
    configure_mock_llm(mock_llm_server_url, [{"text": "stored spec works"}], key=model)
    proc = subprocess.Popen([sys.executable, "-m", "omnigent", "server", "--runners", "1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "listening on " in line, proc.stderr.read()
        async with OmnigentClient(line.split("listening on ")[1].split()[0]) as client:
            with trio.fail_after(30):
                result = await client.run_turn("conv_" + "7" * 32, "hello again")
        assert (result.status, result.text) == ("completed", "stored spec works")
    finally:
        proc.kill()
        proc.wait(timeout=10)
