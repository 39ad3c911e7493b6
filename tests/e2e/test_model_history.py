"""What goes to the model over a conversation with failures, through `omnigent run -p` / `--continue`.

Why: a failed, dropped, retried or text-less turn must leave a conversation
that every model server still accepts (user and assistant alternate, no
empty assistant message, output items sent back as the endpoint returned
them), and each of those says so in one line. The mock LLM captures every
request body, so the test reads exactly what the model received. The same
story against a real llama.cpp server is tests/e2e/test_real_model_server.py.
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest

from tests.conftest import configure_mock_llm, mock_requests
from tests.e2e.test_run_oneshot import agent, run


@pytest.fixture
def env(mock_credentials_env, tmp_path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    return {**mock_credentials_env, "HOME": str(home)}


def sent_messages(body: dict) -> list[dict]:
    """The conversation a request carried, as (role, text) pairs plus the raw items."""
    items = body.get("input") if "input" in body else [m for m in body["messages"] if m["role"] != "system"]
    out = []
    for item in items:
        content = item.get("content")
        text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content or ())
        out.append({"role": item.get("role") or item.get("type"), "text": text, "item": item})
    return out


@pytest.mark.slow  # moved out of the default run to keep it under 5 minutes; .ci/run runs it
@pytest.mark.parametrize("harness", ["openai-agents", "openai-chat"])
def test_failed_dropped_retried_and_textless_turns_leave_a_conversation_every_server_accepts(
        env, tmp_path, mock_llm_server_url, harness):
    model = f"history-{harness}-{uuid.uuid4().hex[:6]}"
    textless = {"native_items": [{"id": "rs_1", "type": "reasoning", "summary": []}]} \
        if harness == "openai-agents" else {"text": ""}
    configure_mock_llm(mock_llm_server_url, [
        {"error": "bad request", "status_code": 400},                          # q1 fails
        {"text": "partial answer that drops", "stream": True, "drop_after": 7},  # q2 drops mid-answer
        {"error": "slow down", "status_code": 429, "retry_after": 0.2},        # q3 is retried...
        textless,                                                              # ... and has no text
        {"text": "FINAL", "stream": True},                                     # q4 answers
    ], key=model)
    path = agent(tmp_path, model, harness)

    first = run(env, path, "-p", "q1")
    assert first.returncode == 1 and first.stderr.startswith("Error: Error code: 400 - bad request")

    dropped = run(env, path, "--continue", "-p", "q2")
    assert dropped.returncode == 1
    assert dropped.stdout == "partial\n"  # what had arrived; the error line says it is partial
    assert dropped.stderr.strip() == "Error: the model's stream ended after 7 characters"

    textless_run = run(env, path, "--continue", "-p", "q3")
    assert textless_run.returncode == 0 and textless_run.stdout == ""
    retry_line, notice = textless_run.stderr.strip().splitlines()
    assert retry_line == "model error 429 (rate limited); retrying in 0.2 s (attempt 2 of 3)"
    assert notice == ("(the model answered with reasoning only, no text)" if harness == "openai-agents"
                      else "(the model's answer was empty)")

    final = run(env, path, "--continue", "-p", "q4")
    assert final.returncode == 0 and final.stdout == "FINAL\n", final.stderr

    requests = [sent_messages(body) for body in mock_requests(mock_llm_server_url, key=model)]
    assert len(requests) == 5  # one per attempt: 4 turns, one of them retried once
    for sent in requests:
        roles = [m["role"] for m in sent]
        assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"], roles  # alternating
        assert all(m["text"].strip() for m in sent)  # no empty message
    assert [m["text"] for m in requests[1]] == ["q1\n\nq2"]
    assert requests[2] == requests[3]  # the retry sends the same request again
    assert [m["text"] for m in requests[3]] == ["q1\n\nq2", "partial", "q3"]
    assert [m["text"] for m in requests[4]] == ["q1\n\nq2", "partial", "q3\n\nq4"]
    if harness == "openai-agents":
        user, partial, _ = (m["item"] for m in requests[4])
        assert set(user) == {"role", "content"}
        # the partial answer goes back as the endpoint's message, with its id, marked incomplete
        assert partial["id"].startswith("msg_") and partial["status"] == "incomplete"
        assert "response_id" not in partial and "created_at" not in partial

    db = Path(env["HOME"]) / ".omnigent" / "chat.db"
    with sqlite3.connect(db) as conn:
        stored = conn.execute("SELECT role, type, status FROM conversation_items ORDER BY position").fetchall()
    expected_textless = [(None, "reasoning", "completed")] \
        if harness == "openai-agents" else []
    assert stored == [("user", "message", "completed"), ("user", "message", "completed"),
                      ("assistant", "message", "incomplete"), ("user", "message", "completed"),
                      *expected_textless, ("user", "message", "completed"), ("assistant", "message", "completed")]
