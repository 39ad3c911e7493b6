"""Tool steps in a real runner process (`python -m omnigent.runner`) with the real tools.

Why: what matters here cannot be seen in a unit test: a long tool must not
make the runner look hung (it keeps answering pings while its tool runs), a
tool's output must never carry the runner's credentials (`env`, and
`/proc/$PPID/environ`, the runner's own), a cancel must answer with what the
tool had printed, and a daemonised grandchild must not outlive the call (the
runner is a subreaper and sweeps). Same fake server and mock LLM as
test_runner_process.py; real processes, every wait bounded, every process
reaped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import trio

from protocol import Cancel, Ping, Pong, ToolResult, ToolStart, TurnCompleted, TurnEvent, TurnStart

from .test_runner_process import WAIT, TOKEN, llm, online, server, spawn  # noqa: F401  (fixtures)

SECRET = "sk-mock-secret-0123456789"


def shell(command: str, workspace: Path, *, call_id: str = "call_1", approval: str = "auto") -> ToolStart:
    return ToolStart(turn_id="turn_t", session_id="conv_t", attempt=1, step=1, call_id=call_id, name="shell",
                     arguments=json.dumps({"command": command}), approval=approval, timeout_s=30.0,
                     workspace=str(workspace))


async def test_pings_are_answered_while_a_long_tool_runs_and_its_output_has_no_credential(spawn, server, tmp_path):
    # no PID namespace: the tool reads its parent's (the runner's) environment through /proc
    runner, conn = await online(spawn, server, env={"OPENAI_API_KEY": SECRET, "OMNIGENT_TOOL_POLICY": "auto",
                                                    "OMNIGENT_TOOL_PIDNS": "0"})
    # The tool runs until the test says so: however slow the machine, it outlasts the pings.
    command = ("env; echo ----; tr '\\0' '\\n' < /proc/$PPID/environ; echo waiting; "
               "while [ ! -e go ]; do sleep 0.05; done")
    await conn.send(shell(command, tmp_path))
    streamed = []
    for n in range(3):
        await conn.send(Ping(ts=float(n)))
        while True:
            frame = await conn.recv()
            assert not isinstance(frame, ToolResult), frame  # still running: the file is not there yet
            if isinstance(frame, Pong):
                assert frame.ts == float(n)
                break
            assert isinstance(frame, TurnEvent) and frame.event["type"] == "session.tool.output"
            streamed.append(frame.event["delta"])
        await trio.sleep(0.2)  # a ping interval; the tool keeps running meanwhile
    (tmp_path / "go").touch()
    while not isinstance(frame := await conn.recv(), ToolResult):
        streamed.append(frame.event["delta"])
    assert frame.status == "completed" and frame.exit_code == 0, frame
    assert "waiting" in frame.output and frame.output.endswith("exit code: 0")
    for text in (frame.output, "".join(streamed)):
        assert SECRET not in text and TOKEN not in text
    own_env, runners_env = frame.output.split("----\n")
    assert "OPENAI_API_KEY=" not in own_env and "OMNIGENT_RUNNER_TOKEN=" not in own_env  # scrubbed
    assert "OPENAI_API_KEY=[redacted]" in runners_env  # the runner's own, read through /proc: redacted


async def test_cancel_answers_the_output_so_far_and_a_setsid_grandchild_is_swept(spawn, server, tmp_path):
    # no PID namespace: `$!` is a pid of this machine's, and the runner's sweep is what ends it
    runner, conn = await online(spawn, server, env={"OMNIGENT_TOOL_POLICY": "auto", "OMNIGENT_TOOL_PIDNS": "0"})
    # A daemonised grandchild outside the tool's process group: only the runner's sweep can end it.
    await conn.send(shell("setsid sleep 300 > /dev/null 2>&1 & echo $!", tmp_path, call_id="call_bg"))
    while not isinstance(frame := await conn.recv(), ToolResult):
        pass
    orphan = int(frame.output.split()[0])
    with trio.fail_after(WAIT):
        while _alive(orphan):
            await trio.sleep(0.02)

    await conn.send(shell("echo started; touch ready; sleep 30", tmp_path, call_id="call_c"))
    with trio.fail_after(WAIT):  # live output holds back a secret's length, so wait on the file
        while not (tmp_path / "ready").exists():
            await trio.sleep(0.02)
    await conn.send(Cancel("turn_t"))
    while not isinstance(frame := await conn.recv(), ToolResult):
        pass
    assert (frame.call_id, frame.status) == ("call_c", "cancelled")
    assert frame.output == "cancelled by the user. Output so far:\nstarted\n"
    await conn.send(Ping(ts=9.0))
    assert await conn.recv() == Pong(ts=9.0)  # and it goes on serving


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
    finally:
        os.sched_yield()


async def test_a_model_step_offers_the_tools_returns_the_calls_and_repeats_byte_identically(spawn, server, llm,
                                                                                             tmp_path):
    _, http = llm
    model = "tools-model"
    call = {"name": "read_file", "arguments": {"path": "notes.txt"}, "call_id": "Ab3dE6gH9"}
    (await http.post("/mock/configure", json={"key": model, "responses": [
        {"text": "Looking.", "tool_calls": [call]}, {"text": "Looking.", "tool_calls": [call]}]})).raise_for_status()
    _, conn = await online(spawn, server)
    agent = {"name": "t", "instructions": "Read.", "harness": "openai-chat", "model": model, "auth": None,
             "reasoning_effort": None, "tools": ["read_file", "shell"]}
    history = [{"role": "user", "content": [{"type": "input_text", "text": "what is in notes.txt?"}]}]
    step = TurnStart(turn_id="turn_m", session_id="conv_m", attempt=1, agent=agent, input=history, model=model,
                     step=0, workspace=str(tmp_path))
    ends = []
    for attempt in (1, 2):  # the same step again, as after a runner died mid-call (a new attempt)
        frames = await conn.turn(TurnStart(**{**step.__dict__, "attempt": attempt}))
        ends.append(frames[-1])
    for end in ends:
        assert isinstance(end, TurnCompleted), end
        assert [i["type"] for i in end.output] == ["message", "function_call"]
        assert {k: end.output[1][k] for k in ("call_id", "name", "arguments")} == {
            "call_id": "Ab3dE6gH9", "name": "read_file", "arguments": '{"path": "notes.txt"}'}
    found = (await http.get("/mock/requests", params={"key": model, "sha256": "1"})).json()
    assert found["count"] == 2 and found["sha256"][0] == found["sha256"][1]
    assert [t["function"]["name"] for t in found["requests"][0]["tools"]] == ["shell", "read_file"]  # canonical order
