"""Credentials as an attacker on this machine meets them: real servers, real runners, real sockets.

- A client holding the API token cannot pose as a live runner (issue 7 §1's
  attack): no hello.ack, no turn, no forged answer stored, and the real
  runner stays registered and serving, on loopback and on a public bind.
- Another local process cannot read an `omnigent run` session through its
  port: the tree's client token lives only in its memory, and a runner's
  secret opens no client route.
- `omnigent server` on loopback without --token is open and says so.

Only loopback traffic: the "public" bind is 127.0.0.2, which is not in the
server's loopback set, so the public rules (token, Host) apply to it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import httpx
import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

import protocol as p
from omnigent.agents import bundle_bytes
from omnigent.client import OmnigentClient
from tests.support.processes import stop
from tests.conftest import configure_mock_llm
from tests.e2e._repl_helpers import agent_env, conversation_ids, new_model, run_args, write_agent
from tests.e2e.test_run_oneshot import tagged_alive

TOKEN = "e2e-client-token-0123456789abcdef"


def start_server(env: dict[str, str], *args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "omnigent", "server", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "listening on " not in line:
        proc.kill()
        raise AssertionError(f"server did not start: {line!r} {proc.stderr.read()}")
    return proc, line.split("listening on ")[1].split()[0]




def environ_of(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [entry.split(b"=", 1) for entry in f.read().split(b"\0") if b"=" in entry]
    return {k.decode(): v.decode(errors="replace") for k, v in pairs}


@pytest.mark.parametrize("bind", ["127.0.0.1", pytest.param("127.0.0.2", marks=pytest.mark.slow)])
async def test_a_client_with_the_api_token_cannot_pose_as_the_live_runner(
        bind, mock_credentials_env, mock_llm_server_url, tmp_path):
    env = {**mock_credentials_env, "HOME": str(tmp_path / "home"), "OMNIGENT_TEST_TAG": uuid.uuid4().hex}
    args = ["--host", bind, "--runners", "1"]
    if bind == "127.0.0.1":
        args += ["--token", TOKEN]
    else:
        env["OMNIGENT_SERVER_TOKEN"] = TOKEN  # through the environment: runners must not inherit it
    model = new_model()
    agent = write_agent(tmp_path, model)
    proc, url = start_server(env, *args)
    try:
        async with OmnigentClient(url, token=TOKEN) as client:
            sid = (await client.create_session(bundle_bytes(agent)))["id"]
            configure_mock_llm(mock_llm_server_url, [{"text": "first real answer"}], key=model)
            with trio.fail_after(30):
                assert (await client.run_turn(sid, "warm up")).text == "first real answer"
            [runner] = await client.list_runners()
            live = runner["runner_id"]
            assert (await client.get_session(sid))["runner_id"] == live
            runner_env = environ_of(runner["pid"])
            assert TOKEN not in "\0".join(runner_env.values())  # runners never hold the client token
            assert runner_env["OMNIGENT_RUNNER_TOKEN"] != TOKEN

            # the attack: the API token on the live runner's id, a hello, a forged answer
            configure_mock_llm(mock_llm_server_url, [{"text": "real again"}] * 3, key=model)
            ws_url = "ws" + url[4:] + f"/v1/runners/{live}/ws"
            for headers in ([("Authorization", f"Bearer {TOKEN}")], []):
                posted = await client.post_message(sid, "a turn the attacker wants")
                async with open_websocket_url(ws_url, extra_headers=headers) as ws:
                    with pytest.raises(ConnectionClosed) as closed:
                        await ws.send_message(p.encode(p.Hello(runner_id=live, pid=os.getpid(),
                                                               protocol_version=p.PROTOCOL_VERSION,
                                                               harnesses=["openai-agents", "openai-chat"])))
                        await ws.send_message(p.encode(p.TurnCompleted(
                            turn_id=posted["turn_id"], response_id="resp_forged",
                            output=[{"type": "message", "role": "assistant", "status": "completed",
                                     "content": [{"type": "output_text", "text": "FORGED"}]}])))
                        got = await ws.get_message()  # the only thing it may get is the close
                        raise AssertionError(f"the attacker was sent {got!r}")
                    assert closed.value.reason.code == 4003
            # the real runner still holds its id and answers; nothing forged was stored
            with trio.fail_after(30):
                assert (await client.run_turn(sid, "still you?")).text == "real again"
            assert [r["runner_id"] for r in await client.list_runners()] == [live]
            texts = [i["content"][0]["text"] for i in await client.list_items(sid)]
            assert "FORGED" not in texts and texts.count("real again") >= 1
            assert [t["status"] for t in await client.list_turns(sid)].count("completed") >= 2
            # the runner's own secret is no client token either
            async with httpx.AsyncClient(base_url=url) as http:
                secret = {"Authorization": f"Bearer {runner_env['OMNIGENT_RUNNER_TOKEN']}"}
                assert (await http.get("/v1/sessions", headers=secret)).status_code == 401
    finally:
        stop(proc)
    assert tagged_alive(env["OMNIGENT_TEST_TAG"]) == []


def listening_port(pid: int) -> int | None:
    """The TCP port process `pid` listens on, from /proc (what any local process can see)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in list(f)[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                    return int(fields[1].rsplit(":", 1)[1], 16)
    return None


async def test_another_local_process_cannot_read_an_omnigent_run_session(
        mock_credentials_env, mock_llm_server_url, tmp_path):
    home = tmp_path / "home"
    model = new_model()
    # The runners' secrets are read from their initial environment below: the CLI's early
    # runner (tree/early.py) has none there (it gets its secret on a pipe), so runners are
    # launched by the host here.
    env = {**agent_env(mock_credentials_env, home), "OMNIGENT_TEST_TAG": uuid.uuid4().hex,
           "OMNIGENT_EARLY_RUNNER": "0"}
    agent = write_agent(tmp_path, model)
    configure_mock_llm(mock_llm_server_url, [{"text": "a private answer"}], key=model)
    planted = subprocess.run([sys.executable, *run_args(agent, "-p", "my secret question")], env=env,
                             capture_output=True, text=True, timeout=60)
    assert planted.returncode == 0, planted.stderr
    [sid] = conversation_ids(home)
    repl = subprocess.Popen([sys.executable, *run_args(agent, "--resume", sid)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert repl.stdout.readline().startswith(f"Resumed conversation {sid}")  # its server is up
        port = listening_port(repl.pid)
        assert port is not None
        base = f"http://127.0.0.1:{port}"
        runner_secrets = [environ_of(pid).get("OMNIGENT_RUNNER_TOKEN") for pid in tagged_alive(env["OMNIGENT_TEST_TAG"])
                          if pid != repl.pid]
        runner_secrets = [s for s in runner_secrets if s]
        assert runner_secrets  # its runners, each with a secret of its own
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            for headers in ({}, {"Authorization": "Bearer guess"},
                            *({"Authorization": f"Bearer {s}"} for s in runner_secrets)):
                for path in ("/v1/sessions", f"/v1/sessions/{sid}", f"/v1/sessions/{sid}/items",
                             f"/v1/sessions/{sid}/stream", "/v1/runners"):
                    resp = await http.get(path, headers=headers)
                    assert resp.status_code == 401, (path, resp.text)
                    assert "private" not in resp.text and "secret question" not in resp.text
                resp = await http.post("/v1/runners", json={}, headers=headers)
                assert resp.status_code == 401  # nor register a runner of its own
        with pytest.raises(ConnectionRejected) as info:
            async with open_websocket_url(f"ws://127.0.0.1:{port}/v1/sessions/{sid}/ws?after=0"):
                pass
        assert info.value.status_code == 401
    finally:
        out, err = repl.communicate("/quit\n", timeout=30)
    assert repl.returncode == 0, err
    assert tagged_alive(env["OMNIGENT_TEST_TAG"]) == []


def test_server_on_loopback_without_a_token_is_open_and_says_so(mock_credentials_env, tmp_path):
    env = {**mock_credentials_env, "HOME": str(tmp_path / "home")}
    env.pop("OMNIGENT_SERVER_TOKEN", None)
    proc, url = start_server(env, "--runners", "0")
    try:
        assert httpx.get(f"{url}/v1/sessions", timeout=5).status_code == 200
    finally:
        stop(proc)
    warnings = [line for line in proc.stderr.read().splitlines() if "token" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: no --token")

    proc, url = start_server(env, "--runners", "0", "--token", TOKEN)
    try:
        assert httpx.get(f"{url}/v1/sessions", timeout=5).status_code == 401
        ok = httpx.get(f"{url}/v1/sessions", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
        assert ok.status_code == 200
    finally:
        stop(proc)
    assert "warning" not in proc.stderr.read()
