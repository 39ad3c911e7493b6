"""`omnigent run` with stdin not a terminal: resumption, the picker's refusal, Ctrl-C.

What the seeds cannot see: that the model call of a resumed turn carries that
conversation's history and no other (read from the mock's captured requests).
"""

from __future__ import annotations

import json
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.conftest import configure_mock_llm, mock_requests
from tests.e2e._repl_helpers import (
    RUN_TIMEOUT,
    agent_env,
    conversation_ids,
    new_model,
    release_gates,
    run_args,
    turn_statuses,
    wait_for_gate,
    write_agent,
)


def _run(python: Path, root: Path, env: dict[str, str], args: list[str], stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([str(python), *args], env=env, cwd=str(root), input=stdin,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT)


@pytest.mark.slow  # out of the default run to keep it under 5 minutes; .ci/run runs it
def test_a_resumed_turn_sends_that_conversation_and_no_other(
    omnigent_python, omnigent_repo_root, mock_credentials_env, mock_llm_server_url, tmp_path,
):
    model = new_model()
    home = tmp_path / "home"
    env = agent_env(mock_credentials_env, home)
    agent = write_agent(tmp_path, model)
    alpha, beta = f"alpha{uuid.uuid4().hex[:8]}", f"beta{uuid.uuid4().hex[:8]}"
    configure_mock_llm(mock_llm_server_url, [{"text": f"ack {alpha}"}, {"text": f"ack {beta}"},
                                             {"text": "recalled"}], key=model)
    for word in (alpha, beta):
        plant = _run(omnigent_python, omnigent_repo_root, env, run_args(agent, "-p", f"remember {word}"))
        assert plant.returncode == 0, plant.stderr
    conv_a, conv_b = conversation_ids(home)

    resumed = _run(omnigent_python, omnigent_repo_root, env, run_args(agent, "--resume", conv_a),
                   "what was the word?\n")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith(f"Resumed conversation {conv_a}\n› remember {alpha}\nack {alpha}\n")
    assert "recalled" in resumed.stdout and beta not in resumed.stdout
    assert f"--resume {conv_a}" in resumed.stderr  # how to come back
    call = json.dumps(mock_requests(mock_llm_server_url, model)[2])
    assert f"remember {alpha}" in call and f"ack {alpha}" in call and "what was the word?" in call
    assert beta not in call

    # -p with --continue: one turn on the newest conversation by activity, which is now A,
    # run with the spec as it is now (another model), not as it was when A began
    newer_model = new_model()
    configure_mock_llm(mock_llm_server_url, [{"text": "continued"}], key=newer_model)
    continued = _run(omnigent_python, omnigent_repo_root, env,
                     run_args(agent, "--continue", "--model", newer_model, "-p", "and now?"))
    assert continued.returncode == 0, continued.stderr
    assert continued.stdout == "continued\n"
    [call] = [json.dumps(body) for body in mock_requests(mock_llm_server_url, newer_model)]
    assert all(text in call for text in (f"remember {alpha}", "recalled", "and now?")) and beta not in call
    assert conversation_ids(home) == [conv_a, conv_b]  # resuming never creates one


def test_resume_without_an_id_and_without_a_terminal_lists_and_asks_for_an_id(
    omnigent_python, omnigent_repo_root, mock_credentials_env, mock_llm_server_url, tmp_path,
):
    model = new_model()
    home = tmp_path / "home"
    env = agent_env(mock_credentials_env, home)
    agent = write_agent(tmp_path, model)
    none_yet = _run(omnigent_python, omnigent_repo_root, env, run_args(agent, "-r"))
    assert none_yet.returncode == 1
    assert "Error: No prior conversation for agent 'repl_e2e'." in none_yet.stderr

    configure_mock_llm(mock_llm_server_url, [{"text": "ok"}], key=model)
    assert _run(omnigent_python, omnigent_repo_root, env, run_args(agent, "-p", "plan the trip")).returncode == 0
    [conv] = conversation_ids(home)
    picked = _run(omnigent_python, omnigent_repo_root, env, run_args(agent, "-r"), "1\n")
    assert picked.returncode == 1
    assert f"  1.  plan the trip  just now  2 messages  {conv}" in picked.stderr
    assert "Error: " in picked.stderr and "--resume <id>" in picked.stderr
    assert conversation_ids(home) == [conv]


def test_ctrl_c_in_a_pipe_cancels_the_turn_and_exits_130(
    omnigent_python, omnigent_repo_root, mock_credentials_env, mock_llm_server_url, tmp_path,
):
    model = new_model()
    home = tmp_path / "home"
    env = agent_env(mock_credentials_env, home)
    agent = write_agent(tmp_path, model)
    configure_mock_llm(mock_llm_server_url, [{"block": True}], key=model)
    proc = subprocess.Popen([str(omnigent_python), *run_args(agent)], env=env, cwd=str(omnigent_repo_root),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        proc.stdin.write("wait for me\nnever run\n")
        proc.stdin.flush()
        wait_for_gate(mock_llm_server_url, model)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        release_gates(mock_llm_server_url)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert turn_statuses(home) == ["cancelled"]
    assert len(mock_requests(mock_llm_server_url, model)) == 1
