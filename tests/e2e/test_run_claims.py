"""One turn at a time per conversation across processes (issue 7 §10), as a user runs it.

Several `omnigent run --continue -p` on one conversation at once: each is its
own process tree (server, host, runner) on the shared store. Their turns take
the conversation's claim in turn, each reading its history only once it holds
it, so the items alternate user/assistant and every answer saw the previous.
A holder SIGKILLed mid-turn does not wedge the conversation.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import configure_mock_llm, mock_requests
from tests.e2e._repl_helpers import new_model, release_gates, wait_for_gate, write_agent
from tests.e2e.test_run_oneshot import env, tagged_alive  # noqa: F401  (fixture)

RUN_TIMEOUT = 60


def omnigent(env, agent: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "omnigent", "run", str(agent), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def roles_and_texts(home: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(home / ".omnigent" / "chat.db") as db:
        rows = db.execute("SELECT role, data FROM conversation_items ORDER BY position").fetchall()
    out = []
    for role, data in rows:
        content = json.loads(data)["content"]
        text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
        out.append((role, text))
    return out


def turn_count(home: Path) -> int:
    with sqlite3.connect(home / ".omnigent" / "chat.db") as db:
        return db.execute("SELECT COUNT(*) FROM turns").fetchone()[0]


def wait_until(predicate, timeout: float = RUN_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.05)


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=RUN_TIMEOUT)


@pytest.mark.slow  # moved out of the default run to keep it under 5 minutes; .ci/run runs it
def test_four_concurrent_continue_runs_take_turns(env, tmp_path, mock_llm_server_url, procs):
    home = Path(env["HOME"])
    model = new_model()
    agent = write_agent(tmp_path, model)
    configure_mock_llm(mock_llm_server_url, [{"text": "answer 0"}, {"block": True, "text": "answer 1"},
                                             {"text": "answer 2"}, {"text": "answer 3"}, {"text": "answer 4"}],
                       key=model)
    first = subprocess.run([sys.executable, "-m", "omnigent", "run", str(agent), "-p", "question 0"],
                           env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert first.returncode == 0, first.stderr
    for i in range(1, 5):
        procs.append(omnigent(env, agent, "--continue", "-p", f"question {i}"))
    wait_for_gate(mock_llm_server_url, model)      # one of them is in its model call
    wait_until(lambda: turn_count(home) == 5)      # and the other three have posted theirs
    release_gates(mock_llm_server_url)
    outs = [proc.communicate(timeout=RUN_TIMEOUT) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0, 0], [err for _, err in outs]
    assert sorted(out.strip() for out, _ in outs) == [f"answer {i}" for i in range(1, 5)]

    items = roles_and_texts(home)
    assert [role for role, _ in items] == ["user", "assistant"] * 5
    # answers in the order the model gave them, each right after the question it answers
    assert [text for _, text in items[1::2]] == [f"answer {i}" for i in range(5)]
    assert items[0][1] == "question 0"
    assert sorted(text for _, text in items[2::2]) == [f"question {i}" for i in range(1, 5)]
    by_process = {out.strip(): f"question {i}" for i, (out, _) in enumerate(outs, start=1)}
    for (_, question), (_, answer) in zip(items[2::2], items[3::2]):
        assert by_process[answer] == question
    # and each model call saw the whole conversation so far: 1, 3, 5, 7, 9 messages
    calls = mock_requests(mock_llm_server_url, key=model)
    assert [len([i for i in call["input"] if i.get("role") in ("user", "assistant")]) for call in calls] \
        == [1, 3, 5, 7, 9]
    assert tagged_alive(env["OMNIGENT_TEST_TAG"]) == []


def test_sigkilled_claim_holder_does_not_wedge_the_conversation(env, tmp_path, mock_llm_server_url, procs):
    home = Path(env["HOME"])
    model = new_model()
    agent = write_agent(tmp_path, model)
    configure_mock_llm(mock_llm_server_url, [{"text": "first"}, {"block": True, "text": "never"},
                                             {"text": "after the kill"}], key=model)
    first = subprocess.run([sys.executable, "-m", "omnigent", "run", str(agent), "-p", "one"],
                           env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert first.returncode == 0, first.stderr
    holder = omnigent(env, agent, "--continue", "-p", "two")
    procs.append(holder)
    wait_for_gate(mock_llm_server_url, model)   # mid-turn, holding the claim
    holder.kill()
    holder.wait(timeout=RUN_TIMEOUT)
    try:
        nxt = subprocess.run([sys.executable, "-m", "omnigent", "run", str(agent), "--continue", "-p", "three"],
                             env=env, capture_output=True, text=True, timeout=10)  # the bound
    finally:
        release_gates(mock_llm_server_url)
    assert nxt.returncode == 0, nxt.stderr
    assert nxt.stdout.strip() == "after the kill"
    roles = [role for role, _ in roles_and_texts(home)]
    assert roles[:2] == ["user", "assistant"] and roles[-1] == "assistant"
    wait_until(lambda: tagged_alive(env["OMNIGENT_TEST_TAG"]) == [], timeout=10)  # its runner followed it
