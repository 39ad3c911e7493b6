"""`omnigent host --permissions`: the host's tool policy reaches the server and every runner, and nothing else sets it.

The policy is the most a host lets its runners' tools do. It goes to the
server in `HostHello.permissions` and into each runner's environment as
`OMNIGENT_TOOL_POLICY` (the runner enforces it again). Neither the daemon's
inherited environment nor a session's env handed over by a client can set
it: a bundle uploaded by a client cannot raise its own mode on this host.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import protocol as p
from omnigent.host import records
from omnigent.host.daemon import DaemonConfig, _Daemon
from omnigent.host.env import TOOL_POLICY_VAR, clean_session_env, runner_env
from omnigent.host.pool import Host
from omnigent.link.memory import memory_link
from supervisor import RestartPolicy
from tests.support.fake_host_processes import FakeLauncher, FakeServer, serve_fake_server

POLICY = RestartPolicy(base=0.5, factor=2, cap=10, jitter=0, reset_after=30, intensity=3, period=10)


def test_no_inherited_or_session_value_passes_the_filter():
    assert TOOL_POLICY_VAR not in runner_env({"PATH": "/bin", TOOL_POLICY_VAR: "auto"})
    assert TOOL_POLICY_VAR not in runner_env({TOOL_POLICY_VAR: "auto", "OMNIGENT_RUNNER_ENV_PASSTHROUGH":
                                              TOOL_POLICY_VAR})
    assert clean_session_env({TOOL_POLICY_VAR: "auto", "OPENAI_API_KEY": "k"}) == {"OPENAI_API_KEY": "k"}


@pytest.mark.parametrize("policy", ["ask", "auto", "deny"])
async def test_every_runner_gets_the_hosts_policy(tmp_path: Path, policy: str, autojump_clock):
    ws = tmp_path / "ws"
    ws.mkdir()
    server_end, host_end = memory_link()
    launcher = FakeLauncher()
    # the environment as given even carries another value: the host's own wins
    host = Host("http://127.0.0.1:1", host_end, log_dir=tmp_path / "logs", workspace=str(tmp_path), runners=1,
                env={"PATH": "/bin", TOOL_POLICY_VAR: "auto"}, policy=POLICY, launcher=launcher,
                tool_policy=policy)
    server = FakeServer()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_fake_server, server_end, server)
        await nursery.start(host.run)
        host.allow_workspace(str(ws))
        host.set_session_env("conv_1", {TOOL_POLICY_VAR: "auto"})
        server_end.post(p.LaunchRunner(request_id="r1", session_id="conv_1", workspace=str(ws)))
        await server.wait_for(p.LaunchResult)
        nursery.cancel_scope.cancel()
    assert len(launcher.processes) == 2  # the slot's runner and the session's
    assert {proc.env[TOOL_POLICY_VAR] for proc in launcher.processes} == {policy}


def test_the_default_is_ask(tmp_path: Path):
    _, host_end = memory_link()
    host = Host("http://127.0.0.1:1", host_end, log_dir=tmp_path, workspace=str(tmp_path), env={})
    assert host.tool_policy == "ask"
    assert DaemonConfig(server_url="http://x", home=tmp_path).permissions == "ask"


def test_the_daemon_says_its_policy_in_hello_record_and_status(tmp_path: Path):
    config = DaemonConfig(server_url="http://127.0.0.1:9", home=tmp_path, permissions="deny")
    daemon = _Daemon(config, records.Paths.of(tmp_path, config.server_url))
    daemon.host_id = "host_1"
    assert daemon.host.tool_policy == "deny"
    assert daemon._hello().permissions == "deny"
    daemon._write_records()
    assert records.read_json(daemon.paths.record)["permissions"] == "deny"
    for op in ("hello", "status"):
        assert trio.run(daemon._control, {"op": op})["permissions"] == "deny"
