"""Tools as a user meets them: an approval on a terminal, `-p` without one, the JSON outputs, stdin.

Each test runs `omnigent run` for real against the mock LLM, which scripts
the model's tool calls (`tool_calls` entries); the tools run in a workspace
of the test's own (the run's cwd).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pexpect
import pytest

from tests.conftest import configure_mock_llm, mock_requests
from tests.e2e._pexpect_harness import PROMPT_READY, submit_prompt

RUN_TIMEOUT = 60
NOT_APPROVED = ("omnigent: shell call not approved (no terminal to ask); "
                "rerun with --permission-mode auto to allow it")


def _model() -> str:
    return f"mock-tools-{uuid.uuid4().hex[:8]}"


def _agent(tmp_path: Path, model: str, tools: str | None, permissions: str = "ask") -> Path:
    path = tmp_path / "agent.yaml"
    extra = f"tools: [{tools}]\npermissions: {permissions}\n" if tools else ""
    path.write_text(f"name: tools_e2e\nprompt: Be brief.\n{extra}executor:\n  model: {model}\n")
    return path


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def env(mock_credentials_env, tmp_path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    return {**mock_credentials_env, "HOME": str(home), "TERM": "xterm-256color"}


def _run(env, workspace: Path, *args, stdin=subprocess.DEVNULL, input=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omnigent", "run", *map(str, args)], env=env, cwd=workspace,
                          stdin=None if input is not None else stdin, input=input,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT)


def _call(name: str, call_id: str = "call_1", **arguments) -> dict:
    return {"tool_calls": [{"name": name, "arguments": json.dumps(arguments), "call_id": call_id}]}


def _function_outputs(request: dict) -> list[str]:
    """The tool results a model request carried (Responses input items)."""
    return [str(item.get("output")) for item in request.get("input") or []
            if isinstance(item, dict) and item.get("type") == "function_call_output"]


def test_an_edit_is_made_only_after_yes_on_the_terminal(env, workspace, tmp_path, mock_llm_server_url):
    model = _model()
    notes = workspace / "notes.txt"
    notes.write_text("colour: old\n")
    configure_mock_llm(mock_llm_server_url, [
        _call("edit_file", path="notes.txt", old_string="old", new_string="new"),
        {"text": "EDITED_IT"},
    ], key=model)
    child = pexpect.spawn(sys.executable, ["-m", "omnigent", "run", str(_agent(tmp_path, model, "edit_file"))],
                          env=env, cwd=str(workspace), encoding="utf-8", codec_errors="replace",
                          timeout=30, dimensions=(40, 120))
    try:
        child.expect(PROMPT_READY)
        submit_prompt(child, "change the colour")
        child.expect(r"-colour: old")  # the diff, above the question
        child.expect(r"\+colour: new")
        child.expect(re.escape("Allow edit_file: notes.txt? [y]es / [n]o / [a]lways this session"))
        assert notes.read_text() == "colour: old\n"  # nothing is written before the answer
        child.send("y\r")
        child.expect("EDITED_IT")
        child.expect(PROMPT_READY)
        assert notes.read_text() == "colour: new\n"
        child.sendcontrol("d")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0
    finally:
        child.close(force=True)
    second = mock_requests(mock_llm_server_url, model)[1]
    assert _function_outputs(second) and "not approved" not in _function_outputs(second)[0]


def test_p_without_a_terminal_refuses_the_call_and_still_answers(env, workspace, tmp_path, mock_llm_server_url):
    model = _model()
    mock = mock_llm_server_url
    configure_mock_llm(mock, [_call("shell", command="touch made_it"), {"text": "COULD_NOT"}], key=model)
    result = _run(env, workspace, _agent(tmp_path, model, "shell"), "-p", "make a file")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "COULD_NOT\n"
    assert NOT_APPROVED in result.stderr.splitlines()
    assert not (workspace / "made_it").exists()
    outputs = _function_outputs(mock_requests(mock, model)[1])
    assert len(outputs) == 1 and "not approved" in outputs[0]


def test_stream_json_is_init_then_items_then_exactly_one_result(env, workspace, tmp_path, mock_llm_server_url):
    model = _model()
    configure_mock_llm(mock_llm_server_url, [_call("shell", command="echo from-the-tool"),
                                                     {"text": "ALL_DONE"}], key=model)
    result = _run(env, workspace, _agent(tmp_path, model, "shell"), "-p", "run it",
                  "--permission-mode", "auto", "--output-format", "stream-json")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]  # every line is one JSON object
    kinds = [line["type"] for line in lines]
    assert kinds[0] == "init" and kinds.count("init") == 1
    assert kinds[-1] == "result" and kinds.count("result") == 1
    assert lines[0]["version"] == 1 and lines[0]["session_id"].startswith("conv_")
    call = next(line for line in lines if line["type"] == "tool_call")
    done = next(line for line in lines if line["type"] == "tool_result")
    assert kinds.index("tool_call") < kinds.index("tool_result")
    assert call["tool"] == "shell" and json.loads(call["arguments"]) == {"command": "echo from-the-tool"}
    assert done["call_id"] == call["call_id"] and done["status"] == "completed"
    assert "from-the-tool" in done["output"]
    assert lines[-1]["result"] == "ALL_DONE" and lines[-1]["is_error"] is False
    assert lines[-1]["session_id"] == lines[0]["session_id"]


def test_json_output_fields(env, workspace, tmp_path, mock_llm_server_url):
    model = _model()
    (workspace / "a.txt").write_text("alpha\n")
    configure_mock_llm(mock_llm_server_url, [_call("read_file", path="a.txt"), {"text": "READ_IT"}],
                       key=model)
    result = _run(env, workspace, _agent(tmp_path, model, "read_file"), "-p", "read a.txt",
                  "--output-format", "json")
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert set(body) == {"version", "session_id", "result", "is_error", "num_steps", "usage", "duration_ms"}
    assert body["version"] == 1 and body["session_id"].startswith("conv_")
    assert body["result"] == "READ_IT" and body["is_error"] is False
    assert body["num_steps"] == 2  # the call, then the answer
    assert set(body["usage"]) == {"input_tokens", "output_tokens", "total_tokens"}
    assert all(isinstance(v, int) for v in body["usage"].values())
    assert isinstance(body["duration_ms"], int) and body["duration_ms"] >= 0


def test_stdin_is_context_and_an_idle_pipe_is_given_up(env, workspace, tmp_path, mock_llm_server_url):
    model = _model()
    mock = mock_llm_server_url
    configure_mock_llm(mock, [{"text": "REVIEWED"}, {"text": "NO_CONTEXT"}], key=model)
    agent = _agent(tmp_path, model, None)
    piped = _run(env, workspace, agent, "-p", "review this", input="+ added line\n")
    assert piped.returncode == 0 and piped.stdout == "REVIEWED\n", piped.stderr
    sent = [i for i in mock_requests(mock, model)[0]["input"] if i.get("role") == "user"]
    assert len(sent) == 1  # one user message: the context fenced, then the prompt
    assert sent[0]["content"][0]["text"] == "```\n+ added line\n```\n\nreview this"

    read_end, write_end = os.pipe()  # held open and silent, as a test harness leaves an inherited pipe
    try:
        idle = subprocess.Popen([sys.executable, "-m", "omnigent", "run", str(agent), "-p", "hello"],
                                env={**env, "OMNIGENT_STDIN_TIMEOUT": "0.3"}, cwd=workspace, stdin=read_end,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        os.close(read_end)
        try:
            out, err = idle.communicate(timeout=RUN_TIMEOUT)
        finally:
            idle.kill()
            idle.wait()
    finally:
        os.close(write_end)
    assert idle.returncode == 0 and out == "NO_CONTEXT\n", err
    assert [line for line in err.splitlines() if "stdin" in line] == [
        "omnigent: nothing arrived on stdin within 0.3 s; going on without it (give </dev/null to skip the wait)"]


def test_output_format_needs_p(env, workspace, tmp_path):
    result = _run(env, workspace, _agent(tmp_path, "m", None), "--output-format", "json")
    assert result.returncode == 1
    assert result.stderr.strip() == "Error: --output-format applies to -p only (the REPL prints text)"


def test_attach_answers_a_pending_approval_and_one_answered_elsewhere_is_dismissed(
    mock_credentials_env, mock_llm_server_url, tmp_path,
):
    """A session driven through the API waits for approvals; `omnigent attach` asks them and answers."""
    import httpx

    from omnigent.agents import bundle_bytes
    from tests.support.processes import omnigent_server

    model = _model()
    ws = tmp_path / "ws"
    ws.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    env = {**mock_credentials_env, "HOME": str(home), "TERM": "xterm-256color"}
    configure_mock_llm(mock_llm_server_url, [
        _call("write_file", call_id="call_a", path="first.txt", content="one\n"),
        _call("write_file", call_id="call_b", path="second.txt", content="two\n"),
        {"text": "BOTH_DONE"},
    ], key=model)
    bundle = bundle_bytes(_agent(tmp_path, model, "write_file"))
    with omnigent_server(env, "--runners", "1") as url, httpx.Client(base_url=url, timeout=30) as http:
        sid = http.post("/v1/sessions", data={"metadata": json.dumps({"workspace": str(ws)})},
                        files={"bundle": ("agent.tar.gz", bundle, "application/gzip")}).json()["session_id"]
        posted = http.post(f"/v1/sessions/{sid}/events", json={"type": "message", "data": {
            "role": "user", "content": "write both", "approval_timeout": None}})
        assert posted.status_code == 202, posted.text
        child = pexpect.spawn(sys.executable, ["-m", "omnigent", "attach", sid, "--server", url], env=env,
                              encoding="utf-8", codec_errors="replace", timeout=30, dimensions=(40, 120))
        try:
            first = re.escape("Allow write_file: first.txt? [y]es / [n]o / [a]lways this session")
            # asked at once if it was pending when attach started, else announced at the prompt
            if child.expect([first, re.escape("(press Enter to answer)")]) == 1:
                child.send("\r")
                child.expect(first)
            assert not (ws / "first.txt").exists()
            child.send("y\r")
            child.expect(re.escape("Allow write_file: second.txt? [y]es / [n]o / [a]lways this session"))
            pending = http.get(f"/v1/sessions/{sid}/approvals", params={"status": "pending"}).json()["data"]
            assert [p["target"] for p in pending] == ["second.txt"]
            answer = http.post(f"/v1/sessions/{sid}/events", json={"type": "approval", "data": {
                "approval_id": pending[0]["id"], "decision": "deny"}})
            assert answer.status_code == 200, answer.text
            child.expect(re.escape("(answered elsewhere: deny)"))  # the question here is dismissed
            child.expect("BOTH_DONE")
            child.expect(PROMPT_READY)
            child.sendcontrol("d")
            child.expect(pexpect.EOF)
        finally:
            child.close(force=True)
    assert (ws / "first.txt").read_text() == "one\n"
    assert not (ws / "second.txt").exists()


@pytest.mark.slow  # two runs and a kill: heavier than the rest
def test_a_tree_killed_at_an_approval_resumes_saying_where_and_retry_asks_again(
    env, workspace, tmp_path, mock_llm_server_url,
):
    """SIGKILL of `omnigent run` while its question is on screen: nothing ran; resume says the turn stopped
    waiting for that approval, and /retry continues from there, asking again."""
    import os
    import signal

    model = _model()
    configure_mock_llm(mock_llm_server_url, [_call("shell", command="echo ran > out.txt"),
                                             {"text": "FINISHED_AFTER_RETRY"}], key=model)
    agent = str(_agent(tmp_path, model, "shell"))
    question = re.escape("Allow shell: echo ran > out.txt? [y]es / [n]o / [a]lways this session")

    def spawn(*args: str) -> pexpect.spawn:
        return pexpect.spawn(sys.executable, ["-m", "omnigent", "run", agent, *args], env=env,
                             cwd=str(workspace), encoding="utf-8", codec_errors="replace", timeout=30,
                             dimensions=(40, 120))

    child = spawn()
    try:
        child.expect(PROMPT_READY)
        submit_prompt(child, "write it")
        child.expect(question)
        os.kill(child.pid, signal.SIGKILL)  # the whole tree: server, host and runner with it
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert not (workspace / "out.txt").exists()

    child = spawn("--continue")
    try:
        child.expect(re.escape("The last turn was interrupted (omnigent stopped in the middle of it, "
                               "waiting for approval of shell); /retry continues from there."))
        child.expect(PROMPT_READY)
        submit_prompt(child, "/retry")
        child.expect([question, "FINISHED_AFTER_RETRY"])  # asked again: nothing was decided before the crash
        assert child.match.group(0) != "FINISHED_AFTER_RETRY", "the call was not asked again"
        child.send("y\r")
        child.expect("FINISHED_AFTER_RETRY")
        child.expect(PROMPT_READY)
        child.sendcontrol("d")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert (workspace / "out.txt").read_text() == "ran\n"
