"""Restart the server mid-turn: the runner reconnects, the turn finishes once, the model was called once.

Real processes and sockets: `omnigent server --runners 0` on a data dir, an
explicit runner launched by `omnigent.cli._start_cli_runner_process` (so it
is not the server's child and outlives it), and the shared mock LLM, whose
answer for this test's model is parked behind a gate until the server has
been SIGKILLed and started again on the same port and store.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from omnigent.agents import bundle_bytes
from omnigent.cli import _start_cli_runner_process, _stop_cli_runner_process
from tests.conftest import configure_mock_llm, mock_requests
from tests.support.processes import stop

WAIT = 30.0


def _serve(env: dict[str, str], data: Path, port: int = 0) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "omnigent", "server", "--runners", "0", "--port", str(port),
                             "--data-dir", str(data)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()  # printed once it listens; empty if it died
    if "listening on " not in line:
        proc.kill()
        proc.wait()
        raise AssertionError(f"server did not start: {line!r}")
    return proc, line.split("listening on ")[1].split()[0]


def _until(what: str, check, proc=None):
    """Poll the server's answer (nothing to wait on but HTTP) within WAIT s."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if proc is not None:
            assert proc.poll() is None, f"{what}: the process exited with {proc.returncode}"
        try:
            value = check()
        except httpx.TransportError:
            value = None
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _gate(mock: str, model: str) -> str | None:
    pending = httpx.get(f"{mock}/gate/pending", timeout=5).json()["pending"]
    return next((g["gate_id"] for g in pending if g.get("model") == model or g.get("key") == model), None)


@pytest.fixture
def env(mock_credentials_env, tmp_path) -> dict[str, str]:
    return {**mock_credentials_env, "HOME": str(tmp_path / "home"), "OMNIGENT_ADOPT_GRACE": "20"}


@pytest.mark.slow  # moved out of the default run to keep it under 5 minutes; .ci/run runs it
def test_restart_the_server_mid_turn_the_runner_reconnects_and_the_turn_ends_once(
        env, tmp_path, mock_llm_server_url, monkeypatch):
    mock = mock_llm_server_url
    model = f"restart-{uuid.uuid4().hex[:8]}"
    configure_mock_llm(mock, [{"text": "answered across a restart", "block": True}], key=model)
    agent = tmp_path / "agent.yaml"
    agent.write_text(f"name: restarted\nprompt: Be brief.\nexecutor:\n  model: {model}\n")
    data = tmp_path / "data"
    server, url = _serve(env, data)
    port = int(url.rsplit(":", 1)[1])
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OMNIGENT_CONFIG_HOME"):
        monkeypatch.setenv(name, env[name])
    runner = _start_cli_runner_process(server_url=url, workspace_cwd=tmp_path, capture_logs=True,
                                       log_dir=tmp_path / "logs", prewarm_spec_path=None)
    try:
        rid = runner.runner_id
        _until("the runner online", lambda: httpx.get(f"{url}/v1/runners/{rid}/status").json()["online"],
               runner.proc)
        created = httpx.post(f"{url}/v1/sessions", files={"bundle": ("agent.tar.gz", bundle_bytes(agent))},
                             data={"metadata": "{}"}, timeout=10)
        assert created.status_code == 201, created.text
        sid = created.json()["session_id"]
        assert httpx.patch(f"{url}/v1/sessions/{sid}", json={"runner_id": rid}, timeout=10).status_code == 200
        posted = httpx.post(f"{url}/v1/sessions/{sid}/events", timeout=10, json={
            "type": "message", "data": {"role": "user", "content": "survive this"}})
        assert posted.status_code == 202, posted.text
        turn_id = posted.json()["turn_id"]
        gate = _until("the model call under way", lambda: _gate(mock, model))

        server.send_signal(signal.SIGKILL)  # mid-turn: the model's answer is parked
        server.wait(timeout=10)
        server, url2 = _serve(env, data, port)
        assert url2 == url
        _until("the runner online again",
               lambda: httpx.get(f"{url}/v1/runners/{rid}/status").json()["online"], runner.proc)
        assert httpx.post(f"{mock}/gate/release", json={"gate_id": gate}, timeout=5).status_code == 200

        def ended():
            turns = httpx.get(f"{url}/v1/sessions/{sid}/turns", timeout=5).json()["data"]
            turn = next(t for t in turns if t["id"] == turn_id)
            return turn if turn["status"] not in ("queued", "running", "interrupted") else None

        turn = _until("the turn to end", ended, server)
        assert (turn["status"], turn["attempt"]) == ("completed", 1), turn
        items = httpx.get(f"{url}/v1/sessions/{sid}/items", timeout=5).json()["data"]
        answers = [i for i in items if i.get("role") == "assistant"]
        assert [i["content"][0]["text"] for i in answers] == ["answered across a restart"]
        assert len(mock_requests(mock, model)) == 1  # one model call for that attempt
        log = runner.log_path.read_text()
        assert "1 turn(s) in flight" in log
        assert runner.proc.poll() is None
    finally:
        _stop_cli_runner_process(runner.proc, grace_timeout=5.0)
        stop(server)


@pytest.mark.slow  # moved out of the default run to keep it under 5 minutes; .ci/run runs it
def test_a_late_result_from_a_session_that_moved_on_is_refused(env, tmp_path, mock_llm_server_url, monkeypatch):
    """Runner A is frozen mid-turn across the restart; meanwhile the session moves to runner B and
    its turn runs again there. When A wakes and reconnects with its answer, it is told to cancel,
    and nothing of it is stored."""
    mock = mock_llm_server_url
    model = f"moved-{uuid.uuid4().hex[:8]}"
    configure_mock_llm(mock, [{"text": "late from A", "block": True}, {"text": "from B"}], key=model)
    agent = tmp_path / "agent.yaml"
    agent.write_text(f"name: moved\nprompt: Be brief.\nexecutor:\n  model: {model}\n")
    data = tmp_path / "data"
    env = {**env, "OMNIGENT_ADOPT_GRACE": "1"}
    server, url = _serve(env, data)
    port = int(url.rsplit(":", 1)[1])
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OMNIGENT_CONFIG_HOME"):
        monkeypatch.setenv(name, env[name])
    a = _start_cli_runner_process(server_url=url, workspace_cwd=tmp_path, capture_logs=True,
                                  log_dir=tmp_path / "logs", prewarm_spec_path=None)
    b = _start_cli_runner_process(server_url=url, workspace_cwd=tmp_path, capture_logs=True,
                                  log_dir=tmp_path / "logs", prewarm_spec_path=None)
    gate = None
    try:
        for r in (a, b):
            _until("the runners online", lambda r=r: httpx.get(f"{url}/v1/runners/{r.runner_id}/status").json()[
                "online"], r.proc)
        created = httpx.post(f"{url}/v1/sessions", files={"bundle": ("agent.tar.gz", bundle_bytes(agent))},
                             data={"metadata": "{}"}, timeout=10)
        sid = created.json()["session_id"]
        httpx.patch(f"{url}/v1/sessions/{sid}", json={"runner_id": a.runner_id}, timeout=10).raise_for_status()
        turn_id = httpx.post(f"{url}/v1/sessions/{sid}/events", timeout=10, json={
            "type": "message", "data": {"role": "user", "content": "who answers?"}}).json()["turn_id"]
        gate = _until("A's model call under way", lambda: _gate(mock, model))
        a.proc.send_signal(signal.SIGSTOP)  # A is frozen with its turn in flight
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=10)
        server, _ = _serve(env, data, port)
        _until("B online again", lambda: httpx.get(f"{url}/v1/runners/{b.runner_id}/status").json()["online"])
        # the session moves on to B (generation bumped); unclaimed after the grace, its turn runs there
        httpx.patch(f"{url}/v1/sessions/{sid}", json={"runner_id": b.runner_id}, timeout=10).raise_for_status()

        def ended():
            turn = next(t for t in httpx.get(f"{url}/v1/sessions/{sid}/turns", timeout=5).json()["data"]
                        if t["id"] == turn_id)
            return turn if turn["status"] == "completed" else None

        turn = _until("the turn to complete on B", ended, server)
        assert (turn["attempt"], turn["runner_id"]) == (2, b.runner_id)
        a.proc.send_signal(signal.SIGCONT)  # A wakes, reconnects and reports its turn: refused
        _until("A told to cancel", lambda: "cancel requested" in a.log_path.read_text(), a.proc)
        httpx.post(f"{mock}/gate/release", json={"gate_id": gate}, timeout=5)
        gate = None
        _until("A online again", lambda: httpx.get(f"{url}/v1/runners/{a.runner_id}/status").json()["online"])
        items = httpx.get(f"{url}/v1/sessions/{sid}/items", timeout=5).json()["data"]
        assert [i["content"][0]["text"] for i in items if i.get("role") == "assistant"] == ["from B"]
        assert len(mock_requests(mock, model)) == 2  # attempt 1 on A, attempt 2 on B: once each
    finally:
        if a.proc.poll() is None:
            a.proc.send_signal(signal.SIGCONT)
        if gate is not None:
            httpx.post(f"{mock}/gate/release", json={"gate_id": gate}, timeout=5)
        for r in (a, b):
            _stop_cli_runner_process(r.proc, grace_timeout=5.0)
        stop(server)
