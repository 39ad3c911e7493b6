"""`omnigent server --data-dir/--database-uri` and the seeds' runner helpers in `omnigent.cli`.

`_start_cli_runner_process` registers an explicit runner with a running
`omnigent server --runners 0` and launches it; these tests check what the
seed (tests/e2e/omnigent) does not: given ids, the 409, isolation, the
runner's environment and argv, its log, and that stopping leaves nothing.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import click
import httpx
import pytest
import trio

from omnigent.agents import bundle_bytes
from omnigent.cli import _start_cli_runner_process, _stop_cli_runner_process
from omnigent_client import ConflictError, OmnigentClient

_SECRET = "s" * 40


def _serve(env: dict[str, str], *args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "omnigent", "server", "--runners", "0", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()  # printed once it listens; empty if it died
    if "listening on " not in line:
        proc.kill()
        raise AssertionError(f"server did not start: {line!r} {proc.stderr.read()}")
    return proc, line.split("listening on ")[1].split()[0]


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0


@pytest.fixture
def server(mock_credentials_env, tmp_path) -> Iterator[str]:
    env = {**mock_credentials_env, "HOME": str(tmp_path / "home")}
    proc, url = _serve(env, "--data-dir", str(tmp_path / "data"))
    try:
        yield url
    finally:
        _stop(proc)
    assert (tmp_path / "data" / "chat.db").is_file()
    assert not (tmp_path / "home" / ".omnigent" / "chat.db").exists()


def _wait_online(url: str, runner_id: str, proc) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"runner exited with {proc.returncode}"
        if httpx.get(f"{url}/v1/runners/{runner_id}/status", timeout=5).json()["online"]:
            return
        time.sleep(0.05)  # nothing to wait on but the server's answer
    raise AssertionError(f"runner {runner_id} not online")


async def _await_online(client: OmnigentClient, runner_id: str, proc) -> None:
    with trio.fail_after(30):
        while not (await client.runners.status(runner_id)).get("online"):
            assert proc.poll() is None, f"runner exited with {proc.returncode}"
            await trio.sleep(0.05)  # nothing to wait on but the server's answer


def test_database_uri_puts_the_store_anywhere_and_other_schemes_are_one_line(mock_credentials_env, tmp_path):
    env = {**mock_credentials_env, "HOME": str(tmp_path / "home")}
    proc, url = _serve(env, "--database-uri", f"sqlite:///{tmp_path / 'elsewhere.db'}")
    try:
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    finally:
        _stop(proc)
    assert (tmp_path / "elsewhere.db").is_file()
    bad = subprocess.run([sys.executable, "-m", "omnigent", "server", "--database-uri", "postgresql://db/x"],
                         env=env, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines() == [
        "Error: --database-uri: only sqlite:///PATH is supported, not 'postgresql': postgresql://db/x"]


def test_given_id_and_secret_are_registered_once_and_never_reach_argv(server, tmp_path, monkeypatch):
    monkeypatch.setenv("OMNIGENT_REMOTE_AUTH_TOKEN", "client-side-only")  # any bearer on a tokenless loopback
    runner = _start_cli_runner_process(server_url=server, runner_id="runner_given_1", tunnel_token=_SECRET,
                                       workspace_cwd=tmp_path, capture_logs=True, log_dir=tmp_path / "logs",
                                       prewarm_spec_path=None, extra_env={"EXTRA_FOR_RUNNER": "1"})
    try:
        assert (runner.runner_id, runner.tunnel_token) == ("runner_given_1", _SECRET)
        _wait_online(server, runner.runner_id, runner.proc)
        environ = dict(kv.split(b"=", 1) for kv in
                       Path(f"/proc/{runner.proc.pid}/environ").read_bytes().split(b"\0") if b"=" in kv)
        assert environ[b"OMNIGENT_RUNNER_TOKEN"] == _SECRET.encode()
        assert environ[b"OMNIGENT_RUNNER_ID"] == b"runner_given_1"
        assert environ[b"EXTRA_FOR_RUNNER"] == b"1"
        assert b"OMNIGENT_REMOTE_AUTH_TOKEN" not in environ and b"OMNIGENT_SERVER_TOKEN" not in environ
        assert _SECRET.encode() not in Path(f"/proc/{runner.proc.pid}/cmdline").read_bytes()
        assert runner.log_path == tmp_path / "logs" / "runner" / "runner_given_1.log"
        assert stat.S_IMODE(runner.log_path.stat().st_mode) == 0o600
        with pytest.raises(click.ClickException, match=r"\(409\).*runner_given_1"):
            _start_cli_runner_process(server_url=server, runner_id="runner_given_1", tunnel_token=_SECRET,
                                      workspace_cwd=tmp_path, capture_logs=False, log_dir=None,
                                      prewarm_spec_path=None)
    finally:
        _stop_cli_runner_process(runner.proc, grace_timeout=5.0)
    assert runner.proc.returncode is not None
    assert not httpx.get(f"{server}/v1/runners/runner_given_1/status", timeout=5).json()["online"]


def test_runner_leaves_on_stdin_eof(server, tmp_path):
    runner = _start_cli_runner_process(server_url=server, workspace_cwd=tmp_path, capture_logs=False,
                                       log_dir=None, prewarm_spec_path=None)
    try:
        assert runner.runner_id.startswith("runner_") and runner.log_path is None
        _wait_online(server, runner.runner_id, runner.proc)
        runner.proc.stdin.close()  # what a caller that dies does
        assert runner.proc.wait(timeout=10) == 0
    finally:
        _stop_cli_runner_process(runner.proc, grace_timeout=1.0)


async def test_isolated_runner_accepts_exactly_one_session(server, tmp_path):
    agent = tmp_path / "agent.yaml"
    agent.write_text("name: isolated\nprompt: Be brief.\nexecutor:\n  model: isolated-model\n")
    runner = _start_cli_runner_process(server_url=server, workspace_cwd=tmp_path, capture_logs=True,
                                       log_dir=tmp_path / "logs", prewarm_spec_path=agent, isolate_session=True)
    plain = _start_cli_runner_process(server_url=server, workspace_cwd=tmp_path, capture_logs=False,
                                      log_dir=None, prewarm_spec_path=None)
    try:
        async with OmnigentClient(server) as client:
            await _await_online(client, runner.runner_id, runner.proc)
            await _await_online(client, plain.runner_id, plain.proc)
            first = await client.sessions.create(bundle_bytes(agent))
            second = await client.sessions.create(bundle_bytes(agent))
            assert (await client.sessions.bind_runner(first.id, runner_id=runner.runner_id)).runner_id \
                == runner.runner_id
            # binding the same session again is fine; a second session is not
            await client.sessions.bind_runner(first.id, runner_id=runner.runner_id)
            with pytest.raises(ConflictError, match="isolated"):
                await client.sessions.bind_runner(second.id, runner_id=runner.runner_id)
            assert (await client.sessions.get(second.id)).runner_id is None
            # a plain explicit runner takes both
            await client.sessions.bind_runner(second.id, runner_id=plain.runner_id)
            await client.sessions.bind_runner(first.id, runner_id=plain.runner_id)
            # the isolated runner is free again once its session moved away
            await client.sessions.bind_runner(second.id, runner_id=runner.runner_id)
    finally:
        _stop_cli_runner_process(runner.proc, grace_timeout=1.0)
        _stop_cli_runner_process(plain.proc, grace_timeout=1.0)
    assert os.path.exists(runner.log_path)


async def test_seed_four_under_trio(server, tmp_path, mock_llm_server_url):
    """Seed test 4's flow (reasoning effort, an explicit runner, SessionsChat) under trio, not asyncio."""
    from omnigent.cli import _bundle
    from omnigent_client import SessionsChat
    from tests.conftest import configure_mock_llm

    agent = tmp_path / "agent.yaml"
    agent.write_text("name: trio_effort\nprompt: Be brief.\nexecutor:\n  model: trio-effort-model\n")
    configure_mock_llm(mock_llm_server_url, [{"text": "TRIO_EFFORT_OK"}], key="trio-effort-model")
    runner = _start_cli_runner_process(
        server_url=server, workspace_cwd=tmp_path, capture_logs=True, log_dir=tmp_path / "logs",
        prewarm_spec_path=agent,
        extra_env={"OPENAI_BASE_URL": f"{mock_llm_server_url}/v1", "OPENAI_API_KEY": "mock-key"})
    try:
        async with OmnigentClient(server) as client:
            await _await_online(client, runner.runner_id, runner.proc)
            created = await client.sessions.create(_bundle(agent), reasoning_effort="high")
            bound = await client.sessions.bind_runner(created.id, runner_id=runner.runner_id)
            files = client.files.for_session(bound.id)
            chat = SessionsChat(namespace=client.sessions, files_uploader=files.upload,
                                files_getter=files.get, session=bound)
            with trio.fail_after(60):
                result = await chat.query("respond with the configured marker")
            assert "TRIO_EFFORT_OK" in result.text
            assert (await client.sessions.get(created.id)).reasoning_effort == "high"
    finally:
        _stop_cli_runner_process(runner.proc, grace_timeout=1.0)
