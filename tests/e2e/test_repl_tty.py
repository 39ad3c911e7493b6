"""The REPL on a real PTY (pexpect): Ctrl-C, line editing keys, history file, picker, exit hint,
Markdown rendering that keeps every marker verbatim, the status line redrawn in place."""

from __future__ import annotations

import io
import re
import subprocess
import uuid

import pexpect

from omnigent.repl.table import display_width
from tests.conftest import configure_mock_llm
from tests.e2e._pexpect_harness import (
    PROMPT_READY,
    STATE_RUNNING,
    STATE_SLEEPING,
    screen_lines,
    submit_prompt,
)
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

TIMEOUT = 30


def _spawn(python, root, env, args) -> pexpect.spawn:
    return pexpect.spawn(str(python), args, env=env, cwd=str(root), encoding="utf-8",
                         codec_errors="replace", timeout=TIMEOUT, dimensions=(40, 120))


def _left_with_the_resume_hint(child: pexpect.spawn) -> str:
    """The REPL leaves as Ctrl-D makes it: the resume hint, then exit 0; the conversation's id."""
    child.expect(r"Resume this conversation with: omnigent run \S+ --resume (conv_\w+)")
    resume_id = child.match.group(1)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    return resume_id


RENDERED = "# Done\n**Reply**: SESSION_LIFECYCLE_OK\nkept: a_b_c and 2*3*4\n- `AFTER_CANCEL`"


def test_ctrl_c_cancels_a_turn_clears_an_idle_line_and_the_repl_stays(
    omnigent_python, omnigent_repo_root, mock_credentials_env, mock_llm_server_url, tmp_path,
):
    model = new_model()
    home = tmp_path / "home"
    env = agent_env(mock_credentials_env, home)
    agent = write_agent(tmp_path, model)
    configure_mock_llm(mock_llm_server_url, [{"block": True}, {"text": "RETRIED_OK"}, {"text": RENDERED}], key=model)
    child = _spawn(omnigent_python, omnigent_repo_root, env, run_args(agent))
    seen = child.logfile_read = io.StringIO()
    try:
        child.expect(STATE_SLEEPING)
        child.expect(PROMPT_READY)
        submit_prompt(child, "wait for me")
        child.expect(STATE_RUNNING)
        wait_for_gate(mock_llm_server_url, model)
        child.sendintr()
        child.expect(re.escape("(cancelled)"))
        child.expect(STATE_SLEEPING)
        child.expect(PROMPT_READY)

        child.send("garbage")
        child.sendintr()  # at the prompt: clears the line, nothing is sent
        submit_prompt(child, "/help")
        child.expect("Commands:")
        child.expect(PROMPT_READY)
        submit_prompt(child, "/bogus")
        child.expect("Unknown command /bogus: type /help")
        child.expect(PROMPT_READY)

        submit_prompt(child, "/history")  # the cancelled turn is marked so
        child.expect(re.escape("› wait for me"))
        child.expect(re.escape("(cancelled)"))
        child.expect(PROMPT_READY)
        submit_prompt(child, "/retry")  # and runs again
        child.expect("RETRIED_OK")
        child.expect(PROMPT_READY)

        submit_prompt(child, "after")  # rendered: the bold is styled, every word and marker verbatim
        child.expect(re.escape("\x1b[1mReply\x1b[0m: SESSION_LIFECYCLE_OK"))
        child.expect(re.escape("kept: a_b_c and 2*3*4"))
        child.expect("AFTER_CANCEL")
        child.expect(PROMPT_READY)
        submit_prompt(child, "/history")
        child.expect(re.escape("SESSION_LIFECYCLE_OK"))
        child.expect(PROMPT_READY)
        child.sendcontrol("d")
        resume_id = _left_with_the_resume_hint(child)
    finally:
        release_gates(mock_llm_server_url)
        child.close(force=True)
    assert conversation_ids(home) == [resume_id]
    assert turn_statuses(home) == ["completed", "completed"]  # the cancelled one, retried
    history = (home / ".omnigent" / "history").read_text().splitlines()
    assert history == ["wait for me", "/help", "/bogus", "/history", "/retry", "after", "/history"]
    screen = screen_lines(seen.getvalue())
    assert not [line for line in screen if "state:" in line]  # redrawn in place, never left behind
    assert screen.count("Reply: SESSION_LIFECYCLE_OK") == 2  # live and in /history, nothing wrapped
    assert screen.count("• AFTER_CANCEL") == 2 and "Done" in screen
    assert "RETRIED_OK" in screen
    assert (home / ".omnigent" / "history").stat().st_mode & 0o777 == 0o600  # what was typed is private


def test_a_ctrl_d_typed_while_a_turn_runs_leaves_once_the_answer_is_shown(
    omnigent_python, omnigent_repo_root, mock_credentials_env, mock_llm_server_url, tmp_path,
):
    """Nobody reads the terminal while a turn runs: a Ctrl-D typed then waits for the next prompt,
    as in a shell, and leaves there (before, the terminal's own end-of-file mark swallowed it)."""
    model = new_model()
    home = tmp_path / "home"
    env = agent_env(mock_credentials_env, home)
    agent = write_agent(tmp_path, model)
    configure_mock_llm(mock_llm_server_url, [{"block": True, "text": "ANSWERED_FIRST"}], key=model)
    child = _spawn(omnigent_python, omnigent_repo_root, env, run_args(agent))
    try:
        child.expect(STATE_SLEEPING)
        child.expect(PROMPT_READY)
        submit_prompt(child, "take your time")
        child.expect(STATE_RUNNING)
        wait_for_gate(mock_llm_server_url, model)
        child.sendcontrol("d")
        release_gates(mock_llm_server_url)
        child.expect("ANSWERED_FIRST")
        _left_with_the_resume_hint(child)
    finally:
        release_gates(mock_llm_server_url)
        child.close(force=True)
    assert turn_statuses(home) == ["completed"]


def test_the_picker_resumes_the_conversation_picked_by_number(
    omnigent_python, omnigent_repo_root, mock_credentials_env, mock_llm_server_url, tmp_path,
):
    model = new_model()
    home = tmp_path / "home"
    env = agent_env(mock_credentials_env, home)
    agent = write_agent(tmp_path, model)
    alpha, beta = f"alpha{uuid.uuid4().hex[:8]} 日本語", f"beta{uuid.uuid4().hex[:8]}"  # a wide title
    configure_mock_llm(mock_llm_server_url, [{"text": f"ack {alpha}"}, {"text": f"ack {beta}"}], key=model)
    for word in (alpha, beta):
        plant = subprocess.run([str(omnigent_python), *run_args(agent, "-p", f"remember {word}")], env=env,
                               cwd=str(omnigent_repo_root), capture_output=True, text=True, timeout=RUN_TIMEOUT)
        assert plant.returncode == 0, plant.stderr
    conv_a, conv_b = conversation_ids(home)
    child = _spawn(omnigent_python, omnigent_repo_root, env, run_args(agent, "-r"))
    try:
        child.expect(rf"1\.\s+remember {beta}\s+just now\s+2 messages\s+{conv_b}")  # newest first
        listing = [child.match.group(0)]
        child.expect(rf"2\.\s+remember {alpha}\s+just now\s+2 messages\s+{conv_a}")
        listing.append(child.match.group(0))
        assert len({display_width(line[:line.index("just now")]) for line in listing}) == 1  # aligned
        child.expect(re.escape("Resume which one? (number or id) "))
        child.send("9\r")
        child.expect("Type a number from 1 to 2, or a conversation id.")
        child.send("2\r")
        child.expect(f"Resumed conversation {conv_a}")
        child.expect(PROMPT_READY)
        transcript = child.before
        assert f"ack {alpha}" in transcript and beta not in transcript
        child.sendcontrol("d")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0
    finally:
        child.close(force=True)
    child = _spawn(omnigent_python, omnigent_repo_root, env, run_args(agent, "-r"))
    try:  # Ctrl-C at the picker leaves it, as Ctrl-D does, with the exit code of an interrupt
        child.expect(re.escape("Resume which one? (number or id) "))
        child.sendintr()
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 130
        assert "Traceback" not in child.before
    finally:
        child.close(force=True)
