"""`omnigent sessions` as a user runs it, on a store that real `omnigent run -p` turns made.

Real processes throughout: the store comes from `run -p` on the mock LLM,
the `sessions` commands open it directly (no server), or go through a real
`omnigent server` with `--server`; `run --fork` opens a piped REPL on a fork.
"""

from __future__ import annotations

import json
import sqlite3
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from tests.conftest import configure_mock_llm, mock_requests
from tests.e2e._repl_helpers import release_gates, wait_for_gate
from tests.e2e.test_run_oneshot import tagged_alive

TIMEOUT = 60


@pytest.fixture
def env(mock_credentials_env, tmp_path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    return {**mock_credentials_env, "HOME": str(home), "OMNIGENT_TEST_TAG": uuid.uuid4().hex}


def _agent(tmp_path: Path, model: str) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(f"name: travel\nprompt: Be brief.\nexecutor:\n  model: {model}\n")
    return path


def omnigent(env: dict[str, str], *args: object, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omnigent", *map(str, args)], env=env, input=stdin, check=False,
                          capture_output=True, text=True, timeout=TIMEOUT)


def sessions(env: dict[str, str], *args: object) -> subprocess.CompletedProcess:
    return omnigent(env, "sessions", *args)


def _ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def _one_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


def _listed(env: dict[str, str], *args: object) -> list[dict]:
    return json.loads(_ok(sessions(env, "list", "--json", *args)))


@pytest.mark.slow  # out of the default run to keep it under 5 minutes; .ci/run runs it
def test_list_show_export_rename_rm_on_the_store_run_made(env, tmp_path, mock_llm_server_url):
    model = f"sessions-{uuid.uuid4().hex[:8]}"
    configure_mock_llm(mock_llm_server_url, [{"text": "Lisbon, in May."}, {"text": "Pack light."}], key=model)
    agent = _agent(tmp_path, model)
    assert _ok(omnigent(env, "run", agent, "-p", "where should I travel?")) == "Lisbon, in May.\n"
    _ok(omnigent(env, "run", agent, "--name", "packing 日本", "-p", "what to pack?"))
    trip, packing = (r["id"] for r in reversed(_listed(env)))  # most recently active first

    table = _ok(sessions(env, "list")).splitlines()
    assert table[0].split() == ["ID", "UPDATED", "MSGS", "AGENT", "NAME"]
    assert table[1].split() == [packing, "just", "now", "2", "travel", "packing", "日本"]
    assert table[2].split()[0] == trip and table[2].endswith("where should I travel?")
    assert [r["id"] for r in _listed(env, "--limit", "1")] == [packing]
    [found] = _listed(env, "-q", "Lisbon")
    assert found["id"] == trip and "Lisbon" in found["snippet"]

    shown = _ok(sessions(env, "show", trip))
    assert shown.startswith(f"where should I travel?\n{trip} · travel · 2 messages")
    assert "\n› where should I travel?\n\nLisbon, in May.\n" in shown
    items = json.loads(_ok(sessions(env, "show", trip, "--json")))["items"]
    assert [i.get("role") for i in items] == ["user", "assistant"]

    out = tmp_path / "trip.jsonl"
    _ok(sessions(env, "export", trip, "--format", "jsonl", "-o", out))
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    head, *rest = (json.loads(line) for line in out.read_text().splitlines())
    assert head["type"] == "session" and head["id"] == trip and rest == items

    assert _ok(sessions(env, "rename", trip, "Lisbon trip")) == f"Renamed {trip} to 'Lisbon trip'\n"
    assert {r["id"]: r["title"] for r in _listed(env)}[trip] == "Lisbon trip"

    refused = _one_error(sessions(env, "rm", trip))  # stdin is a pipe: nobody to ask
    assert "--yes" in refused
    for answer, code in (("n", 1), ("y", 0)):  # on a terminal it asks first
        child = pexpect.spawn(sys.executable, ["-m", "omnigent", "sessions", "rm", trip], env=env,
                              encoding="utf-8", timeout=TIMEOUT)
        try:
            child.expect_exact(f"Delete session {trip} ('Lisbon trip', 2 messages)? [y/N]: ")
            child.sendline(answer)
            child.expect(pexpect.EOF)
        finally:
            child.close(force=True)
        assert child.exitstatus == code, child.before
        assert (f"Deleted {trip}" in child.before) == (answer == "y")
    assert [r["id"] for r in _listed(env)] == [packing]
    for command in (("show", trip), ("fork", trip)):
        assert "omnigent sessions list" in _one_error(sessions(env, *command))
    with sqlite3.connect(Path(env["HOME"]) / ".omnigent" / "chat.db") as db:
        assert db.execute("SELECT COUNT(*) FROM conversation_items WHERE conversation_id = ?", [trip]).fetchone() == (0,)
    assert tagged_alive(env["OMNIGENT_TEST_TAG"]) == []  # nothing was started


def test_a_missing_store_lists_nothing_and_a_foreign_one_is_one_line(env, tmp_path):
    db = Path(env["HOME"]) / ".omnigent" / "chat.db"
    result = sessions(env, "list")
    assert (result.returncode, result.stdout) == (0, "") and not db.exists()  # nothing created
    assert _ok(sessions(env, "list", "--json")) == "[]\n"
    assert "omnigent sessions list" in _one_error(sessions(env, "show", "conv_nope"))
    db.parent.mkdir()
    db.write_bytes(b"not a database at all" * 10)
    assert "not an SQLite database" in _one_error(sessions(env, "list"))


def test_fork_then_run_fork_answers_on_the_copy_and_the_source_stays(env, tmp_path, mock_llm_server_url):
    model = f"sessions-{uuid.uuid4().hex[:8]}"
    word = f"nonce{uuid.uuid4().hex[:6]}"
    configure_mock_llm(mock_llm_server_url, [{"text": f"noted {word}"}, {"text": "on the fork"}], key=model)
    agent = _agent(tmp_path, model)
    _ok(omnigent(env, "run", agent, "-p", f"remember {word}"))
    [source] = _listed(env)

    cli_fork = _ok(sessions(env, "fork", source["id"], "--name", "branch")).strip()
    assert cli_fork.startswith("conv_") and cli_fork != source["id"]
    assert json.loads(_ok(sessions(env, "show", cli_fork, "--json")))["forked_from"] == source["id"]

    assert _one_error(omnigent(env, "run", agent, "--fork", source["id"], "-p", "x")) == (
        "Error: --fork requires interactive REPL mode; remove -p/--prompt.")
    assert _one_error(omnigent(env, "run", agent, "--fork", source["id"], "--continue")).startswith("Error: --fork")

    repl = omnigent(env, "run", agent, "--fork", source["id"], "--name", "second try", stdin="and now?\n")
    assert repl.returncode == 0, repl.stderr
    forked = next(r for r in _listed(env) if r["title"] == "second try")
    assert repl.stdout.startswith(f"Resumed conversation {forked['id']}\n› remember {word}\nnoted {word}\n")
    assert "on the fork" in repl.stdout
    call = json.dumps(mock_requests(mock_llm_server_url, model)[-1])
    assert f"remember {word}" in call and "and now?" in call  # the fork's history went to the model
    by_id = {r["id"]: r for r in _listed(env)}
    assert by_id[forked["id"]]["message_count"] == 4 and by_id[forked["id"]]["forked_from"] == source["id"]
    assert by_id[source["id"]]["message_count"] == 2  # the source as it was
    assert "on the fork" not in _ok(sessions(env, "show", source["id"]))


@pytest.fixture
def served(env) -> Iterator[str]:
    """`omnigent server --token` on this test's HOME: its URL; stopped (and checked gone) after."""
    server = subprocess.Popen([sys.executable, "-m", "omnigent", "server", "--runners", "1", "--token", "s3cret"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        assert "listening on " in line, server.stderr.read()
        yield line.split("listening on ")[1].split()[0]
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    assert tagged_alive(env["OMNIGENT_TEST_TAG"]) == []


@pytest.mark.parametrize("via", ["server", "local"])
async def test_rm_cancels_the_running_turn(via, env, served, tmp_path, mock_llm_server_url):
    """Through --server the server cancels it; on the local store the rm asks through the store and
    the server cancels at its next claim renewal. Either way: no answer, gone, the runner free."""
    import trio

    from omnigent.agents import bundle_bytes
    from omnigent.client import OmnigentClient

    model = f"sessions-{uuid.uuid4().hex[:8]}"
    configure_mock_llm(mock_llm_server_url, [{"block": True}, {"text": "still serving"}], key=model)
    url = served
    remote = ("--server", url) if via == "server" else ()
    env = {**env, "OMNIGENT_REMOTE_AUTH_TOKEN": "s3cret"} if via == "server" else env

    async def cli(*args: object, environ: dict[str, str] = env) -> subprocess.CompletedProcess:
        return await trio.run_process([sys.executable, "-m", "omnigent", "sessions", *map(str, args)], env=environ,
                                      capture_stdout=True, capture_stderr=True, check=False)

    try:
        async with OmnigentClient(url, token="s3cret") as client:
            session = await client.create_session(bundle_bytes(_agent(tmp_path, model)), title="doomed")
            stream = client.sessions.stream(session["id"], heartbeats=True, reconnect=False)
            seen = []
            with trio.fail_after(TIMEOUT):
                async with stream:
                    await stream.__anext__()  # subscribed before the message goes
                    await client.post_message(session["id"], "take your time")
                    await trio.to_thread.run_sync(wait_for_gate, mock_llm_server_url, model)
                    listed = await cli("list", "--json", *remote)
                    assert [r["title"] for r in json.loads(listed.stdout)] == ["doomed"]
                    removed = await cli("rm", session["id"], "--yes", *remote)
                    assert (removed.returncode, removed.stdout) == (0, f"Deleted {session['id']}\n".encode()), \
                        removed.stderr
                    async for event in stream:  # through the server the stream ends; locally it goes on
                        seen.append(event.type)
                        if event.type == "response.cancelled" and via == "local":
                            break
                assert "response.created" in seen and "response.completed" not in seen, seen
                if via == "local":  # the live server cancelled the turn itself, before the rows went
                    assert "response.cancelled" in seen, seen
                assert await client.list_sessions() == []
                # the runner was told and is free: a new session's turn is answered
                other = await client.create_session(bundle_bytes(_agent(tmp_path, model)))
                assert (await client.run_turn(other["id"], "still there?")).text == "still serving"
        shown = await cli("show", session["id"], *remote)
        assert shown.returncode == 1 and b"omnigent sessions list" in shown.stderr
        if via == "server":
            no_token = {k: v for k, v in env.items() if k != "OMNIGENT_REMOTE_AUTH_TOKEN"}
            denied = await cli("list", "--server", url, environ=no_token)
            assert denied.returncode == 1 and len(denied.stderr.splitlines()) == 1
    finally:
        release_gates(mock_llm_server_url)
