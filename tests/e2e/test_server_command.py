"""`omnigent server`: the API with local runners as a long-running process any client can use."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import trio

from omnigent.agents import bundle_bytes
from omnigent.client import OmnigentClient
from tests.conftest import configure_mock_llm
from tests.e2e.test_run_oneshot import tagged_alive


@pytest.fixture
def server_proc(mock_credentials_env, tmp_path):
    import uuid

    env = {**mock_credentials_env, "HOME": str(tmp_path / "home"), "OMNIGENT_TEST_TAG": uuid.uuid4().hex}
    proc = subprocess.Popen([sys.executable, "-m", "omnigent", "server", "--runners", "1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "listening on " in line, proc.stderr.read()
        url = line.split("listening on ")[1].split()[0]
        yield proc, url, env
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


async def test_server_serves_turns_and_stops_cleanly_on_sigterm(server_proc, mock_llm_server_url, tmp_path):
    proc, url, env = server_proc
    agent = tmp_path / "agent.yaml"
    agent.write_text("name: served\nprompt: Be brief.\nexecutor:\n  model: served-model\n")
    configure_mock_llm(mock_llm_server_url, [{"text": "served answer"}], key="served-model")
    async with OmnigentClient(url) as client:
        session = await client.create_session(bundle_bytes(agent))
        with trio.fail_after(30):
            result = await client.run_turn(session["id"], "hello server")
        assert (result.status, result.text) == ("completed", "served answer")
        assert [r["online"] for r in await client.list_runners()] == [True]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    assert tagged_alive(env["OMNIGENT_TEST_TAG"]) == []
    assert (tmp_path / "home" / ".omnigent" / "chat.db").exists()


def test_server_off_loopback_requires_the_token(mock_credentials_env, tmp_path):
    import httpx

    env = {**mock_credentials_env, "HOME": str(tmp_path / "home")}
    proc = subprocess.Popen([sys.executable, "-m", "omnigent", "server", "--host", "0.0.0.0", "--runners", "0",
                             "--token", "s3cret"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        port = proc.stdout.readline().split("listening on ")[1].split()[0].rsplit(":", 1)[1]
        base = f"http://127.0.0.1:{port}"
        denied = httpx.get(f"{base}/v1/sessions", timeout=5)
        assert denied.status_code == 401 and denied.json()["error"]["code"] == "unauthorized"
        allowed = httpx.get(f"{base}/v1/sessions", headers={"Authorization": "Bearer s3cret"}, timeout=5)
        assert allowed.status_code == 200 and allowed.json()["data"] == []
        assert httpx.get(f"{base}/health", timeout=5).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
