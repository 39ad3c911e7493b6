"""A store written by the previous release opens, upgrades and resumes through the CLI.

`tests/resources/stores/chat-0.1.0.db` was made by release 0.1.0 (see the script beside it)
and is never regenerated: every later migration must upgrade it without losing a thing.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from omnigent.store.migrations import MIGRATIONS
from tests.conftest import REPO_ROOT, configure_mock_llm, mock_requests

OLD_STORE = REPO_ROOT / "tests" / "resources" / "stores" / "chat-0.1.0.db"


@pytest.fixture
def home(tmp_path) -> Path:
    home = tmp_path / "home"
    (home / ".omnigent").mkdir(parents=True)
    shutil.copy(OLD_STORE, home / ".omnigent" / "chat.db")
    return home


def _rows(db: Path, sql: str, params=()) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, params).fetchall()


@pytest.mark.parametrize("agent_name,harness", [("legacy-agents", "openai-agents"), ("legacy-chat", "openai-chat")])
def test_old_store_upgrades_and_resumes(home, tmp_path, mock_credentials_env, mock_llm_server_url,
                                        agent_name, harness):
    db = home / ".omnigent" / "chat.db"
    before = _rows(db, "SELECT id, title FROM conversations ORDER BY id")
    items_before = _rows(db, "SELECT conversation_id, id, data FROM conversation_items ORDER BY conversation_id, position")
    conv_id = _rows(db, """SELECT c.id FROM conversations c JOIN agents a ON a.id = c.agent_id
                           WHERE a.name = ? ORDER BY c.created_at LIMIT 1""", [agent_name])[0][0]
    model = f"upgrade-{uuid.uuid4().hex[:8]}"
    configure_mock_llm(mock_llm_server_url, [{"text": "resumed fine"}], key=model)
    spec = tmp_path / "agent.yaml"
    spec.write_text(f"name: {agent_name}\nprompt: Reply briefly.\nexecutor:\n  harness: {harness}\n  model: {model}\n")
    env = {**mock_credentials_env, "HOME": str(home)}
    result = subprocess.run([sys.executable, "-m", "omnigent", "run", str(spec), "--resume", conv_id,
                             "-p", "one more question"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "resumed fine\n"

    # the model saw the old conversation, in order, then the new question
    [call] = mock_requests(mock_llm_server_url, key=model)
    sent = str(call.get("input") or call.get("messages"))
    first_q, first_a, second_q = "legacy question 0.0", "legacy answer 0.0", "legacy question 0.1"
    if agent_name == "legacy-chat":
        first_q, first_a, second_q = "legacy question 1.0", "legacy answer 1.0", "legacy question 1.1"
    assert sent.index(first_q) < sent.index(first_a) < sent.index(second_q) < sent.index("one more question")

    # every migration applied, nothing lost, the file sound
    applied = {name for (name,) in _rows(db, "SELECT name FROM migrations UNION SELECT name FROM additive_migrations")}
    assert applied == {m.name for m in MIGRATIONS}
    assert _rows(db, "PRAGMA integrity_check") == [("ok",)]
    assert _rows(db, "SELECT id, title FROM conversations ORDER BY id") == before
    kept = _rows(db, "SELECT conversation_id, id, data FROM conversation_items ORDER BY conversation_id, position")
    assert [row for row in kept if row[0] != conv_id] == [row for row in items_before if row[0] != conv_id]
    assert len([row for row in kept if row[0] == conv_id]) == 4 + 2


async def test_old_store_upgrades_and_resumes_through_the_sdk(home, tmp_path, mock_credentials_env,
                                                               mock_llm_server_url):
    """`omnigent server` on the previous release's store; the SDK lists, reads and continues a conversation."""
    from omnigent_client import OmnigentClient, SessionsChat
    from tests.support.processes import omnigent_server

    db = home / ".omnigent" / "chat.db"
    conv_id = _rows(db, """SELECT c.id FROM conversations c JOIN agents a ON a.id = c.agent_id
                           WHERE a.name = 'legacy-agents' ORDER BY c.created_at LIMIT 1""")[0][0]
    model = f"upgrade-sdk-{uuid.uuid4().hex[:8]}"
    configure_mock_llm(mock_llm_server_url, [{"text": "resumed through the SDK"}], key=model)
    env = {**mock_credentials_env, "HOME": str(home)}
    with omnigent_server(env, "--runners", "1") as url:
        async with OmnigentClient(url) as client:
            listed = await client.sessions.list(limit=100)
            assert len(listed) == 100
            old_items = await client.sessions.list_items(conv_id)
            assert len(old_items) == 4
            session = await client.sessions.update(conv_id, model_override=model)
            session = await client.sessions.get(conv_id)
            chat = SessionsChat(namespace=client.sessions, session=session,
                                files_uploader=None, files_getter=None)
            result = await chat.query("one more question")
            assert "resumed through the SDK" in result.text
            assert len(await client.sessions.list_items(conv_id)) == 6
    [call] = mock_requests(mock_llm_server_url, key=model)
    sent = str(call.get("input") or call.get("messages"))
    assert sent.index("legacy question 0.0") < sent.index("legacy answer 0.0") < sent.index("one more question")
    assert _rows(db, "PRAGMA integrity_check") == [("ok",)]


RELEASE_0_1_0 = "2fe0c5e"  # the commit released as 0.1.0, the code that wrote chat-0.1.0.db


@pytest.fixture
def release_0_1_0(tmp_path) -> Path:
    """Release 0.1.0's own code, from this repository's history (skipped where the history is absent)."""
    where = tmp_path / "release-0.1.0"
    where.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", RELEASE_0_1_0, "omnigent", "supervisor",
                              "protocol"], capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"release 0.1.0 ({RELEASE_0_1_0}) is not in this checkout's git history")
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True)
    return where


def test_release_0_1_0_keeps_working_on_an_upgraded_store(home, tmp_path, release_0_1_0, mock_credentials_env,
                                                           mock_llm_server_url):
    """Upgrade with this release, then resume a conversation with 0.1.0's code, then again with ours."""
    db = home / ".omnigent" / "chat.db"
    conv_id = _rows(db, """SELECT c.id FROM conversations c JOIN agents a ON a.id = c.agent_id
                           WHERE a.name = 'legacy-agents' ORDER BY c.created_at LIMIT 1""")[0][0]
    spec = tmp_path / "agent.yaml"
    models = [f"compat-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    env = {**mock_credentials_env, "HOME": str(home)}

    def run(model: str, code: Path | None) -> subprocess.CompletedProcess:
        configure_mock_llm(mock_llm_server_url, [{"text": f"answer from {model}"}], key=model)
        spec.write_text(f"name: legacy-agents\nprompt: Reply briefly.\nexecutor:\n  harness: openai-agents\n"
                        f"  model: {model}\n")
        run_env = dict(env)
        if code is not None:  # the old code first on the path, run from its own directory
            run_env["PYTHONPATH"] = str(code)
        return subprocess.run([sys.executable, "-m", "omnigent", "run", str(spec), "--resume", conv_id,
                               "-p", f"question for {model}"], env=run_env, cwd=code or tmp_path,
                              capture_output=True, text=True, timeout=60)

    for model, code in zip(models, (None, release_0_1_0, None)):
        result = run(model, code)
        assert result.returncode == 0, result.stderr
        assert result.stdout == f"answer from {model}\n"
    # the last turn (ours again) saw what 0.1.0 added
    [call] = mock_requests(mock_llm_server_url, key=models[2])
    sent = str(call.get("input") or call.get("messages"))
    assert sent.index(f"question for {models[0]}") < sent.index(f"answer from {models[1]}") < sent.index(
        f"question for {models[2]}")
    assert _rows(db, "PRAGMA integrity_check") == [("ok",)]
