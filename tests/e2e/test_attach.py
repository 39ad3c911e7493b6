"""`omnigent attach` on a real PTY against a real `omnigent server`: it replays, then shows a turn
another client posts; it sends messages like the REPL; `--watch` refuses input."""

from __future__ import annotations

import re
import subprocess
import sys

import httpx
import pexpect
import pytest

from omnigent.agents import bundle_bytes
from tests.conftest import configure_mock_llm
from tests.e2e._pexpect_harness import PROMPT_READY, STATE_SLEEPING, clean_exit, submit_prompt
from tests.e2e._repl_helpers import agent_env, new_model, write_agent
from tests.support.processes import omnigent_server

TIMEOUT = 30


@pytest.fixture
def served(mock_credentials_env, mock_llm_server_url, tmp_path):
    """An `omnigent server` with one runner, a session on it and a client to drive it."""
    model = new_model()
    env = agent_env(mock_credentials_env, tmp_path / "home")
    with omnigent_server(env, "--runners", "1") as url, httpx.Client(base_url=url, timeout=TIMEOUT) as http:
        bundle = bundle_bytes(write_agent(tmp_path, model))
        sid = http.post("/v1/sessions", data={"metadata": "{}"},
                        files={"bundle": ("agent.tar.gz", bundle, "application/gzip")}).json()["session_id"]
        yield url, sid, http, model, env


def _spawn(env, *args) -> pexpect.spawn:
    return pexpect.spawn(sys.executable, ["-m", "omnigent", "attach", *args], env=env, encoding="utf-8",
                         codec_errors="replace", timeout=TIMEOUT, dimensions=(40, 120))


def _post(http: httpx.Client, sid: str, text: str) -> None:
    resp = http.post(f"/v1/sessions/{sid}/events", json={"type": "message", "data": {"role": "user",
                                                                                   "content": text}})
    assert resp.status_code == 202, resp.text


def _answered(http: httpx.Client, sid: str) -> None:
    """Wait on the session's stream for the end of its first turn."""
    with http.stream("GET", f"/v1/sessions/{sid}/stream", params={"after": 0}) as resp:
        for line in resp.iter_lines():
            if line == "event: response.completed":
                return


def test_attach_replays_then_shows_a_turn_another_client_posts_and_can_send(served, mock_llm_server_url):
    url, sid, http, model, env = served
    configure_mock_llm(mock_llm_server_url, [{"text": "FIRST_ANSWER"}, {"text": "SECOND_ANSWER"},
                                             {"text": "THIRD_ANSWER"}], key=model)
    _post(http, sid, "question before attach")
    _answered(http, sid)
    child = _spawn(env, sid, "--server", url)
    try:
        child.expect(re.escape(f"attached to conversation {sid}"))
        child.expect("question before attach")  # the replay: the log from its first event
        child.expect("FIRST_ANSWER")
        child.expect(STATE_SLEEPING)  # after the replay
        child.expect(PROMPT_READY)
        _post(http, sid, "posted by another client")
        child.expect("posted by another client")
        child.expect("SECOND_ANSWER")
        submit_prompt(child, "typed in attach")
        child.expect("THIRD_ANSWER")
        child.expect(STATE_SLEEPING)
        child.expect(PROMPT_READY)
        clean_exit(child, TIMEOUT)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    items = http.get(f"/v1/sessions/{sid}/items").json()["data"]
    assert [i["content"][0]["text"] for i in items if i["role"] == "user"] == [
        "question before attach", "posted by another client", "typed in attach"]


def test_attach_watch_refuses_input_and_leaving_cancels_nothing(served, mock_llm_server_url):
    url, sid, http, model, env = served
    configure_mock_llm(mock_llm_server_url, [{"text": "WATCHED_ANSWER"}], key=model)
    child = _spawn(env, sid, "--server", url, "--watch")
    try:
        child.expect(re.escape(f"watching conversation {sid}"))
        child.expect(STATE_SLEEPING)
        child.expect(PROMPT_READY)
        submit_prompt(child, "let me in")
        child.expect(re.escape("read-only (--watch)"))
        child.expect(PROMPT_READY)
        _post(http, sid, "from elsewhere")
        child.expect("WATCHED_ANSWER")
        clean_exit(child, TIMEOUT)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    items = http.get(f"/v1/sessions/{sid}/items").json()["data"]
    assert [i["content"][0]["text"] for i in items if i["role"] == "user"] == ["from elsewhere"]


def test_attach_without_a_server_or_to_an_unknown_session_says_so_in_one_line(served, tmp_path):
    url, sid, http, model, env = served
    lonely = {**env, "HOME": str(tmp_path / "elsewhere")}
    gone = subprocess.run([sys.executable, "-m", "omnigent", "attach", sid], env=lonely,
                          capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1 and "--server" in gone.stderr
    unknown = subprocess.run([sys.executable, "-m", "omnigent", "attach", "conv_nope", "--server", url],
                             env=env, capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert unknown.returncode == 1 and "Conversation 'conv_nope' not found." in unknown.stderr
