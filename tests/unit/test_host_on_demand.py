"""The host pool's on-demand runners (the daemon's `LaunchRunner`), on a MockClock with fake processes."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import pytest
import trio
import trio.testing

import protocol as p
from omnigent.host.env import runner_env
from omnigent.host.pool import Host
from omnigent.link.memory import memory_link
from supervisor import RestartPolicy
from tests.support.fake_host_processes import FakeLauncher, FakeServer, serve_fake_server

POLICY = RestartPolicy(base=0.5, factor=2, cap=10, jitter=0, reset_after=30, intensity=3, period=10)


def _host(tmp_path: Path, launcher: FakeLauncher, **kw):
    server_end, host_end = memory_link()
    env = runner_env({"PATH": "/bin", "HOME": str(tmp_path), "OMNIGENT_REMOTE_AUTH_TOKEN": "client",
                      "OMNIGENT_SERVER_TOKEN": "server", "OPENAI_API_KEY": "daemon-key", "SECRET_X": "x"})
    host = Host("http://127.0.0.1:1", host_end, log_dir=tmp_path / "logs", workspace=str(tmp_path),
                runners=0, env=env, policy=POLICY, launcher=launcher, **kw)
    return host, server_end


async def _run(tmp_path, body, **kw):
    launcher = FakeLauncher()
    host, server_end = _host(tmp_path, launcher, **kw)
    server = FakeServer()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_fake_server, server_end, server)
        await nursery.start(host.run)
        await body(host, server_end, server, launcher)
        nursery.cancel_scope.cancel()
    return host, server, launcher


@pytest.fixture
def ws(tmp_path):
    d = tmp_path / "ws"
    d.mkdir()
    return d


async def test_allowed_workspace_launches_with_the_session_env(tmp_path, ws, caplog, autojump_clock):
    caplog.set_level(logging.INFO, logger="omnigent.host")

    async def body(host, link, server, launcher):
        host.allow_workspace(str(ws))
        host.set_session_env("conv_1", {"OPENAI_BASE_URL": "http://mock-1/v1", "OPENAI_API_KEY": "k1",
                                        "OMNIGENT_REMOTE_AUTH_TOKEN": "smuggled"})
        link.post(p.LaunchRunner(request_id="r1", session_id="conv_1", workspace=str(ws)))
        (result,) = await server.wait_for(p.LaunchResult)
        assert result.error_code is None and result.runner_id.startswith("runner_")
        kinds = [type(f) for f in server.frames]
        assert kinds[:3] == [p.RunnerCredential, p.RunnerLaunched, p.LaunchResult]
        (proc,) = launcher.processes
        assert proc.cwd == str(ws)
        assert proc.env["OPENAI_BASE_URL"] == "http://mock-1/v1" and proc.env["OPENAI_API_KEY"] == "k1"
        for name in ("OMNIGENT_REMOTE_AUTH_TOKEN", "OMNIGENT_SERVER_TOKEN", "SECRET_X"):
            assert name not in proc.env
        assert proc.env["OMNIGENT_RUNNER_ID"] == result.runner_id
        assert proc.log_path.parent.name == "host-runner"
        assert f"Launched runner {result.runner_id} for workspace {ws} (pid={proc.pid})" in caplog.text
        assert host.live_runners() == [result.runner_id]

    await _run(tmp_path, body)


async def test_subdirectory_of_a_root_is_allowed(tmp_path, ws, autojump_clock):
    (ws / "sub").mkdir()

    async def body(host, link, server, launcher):
        link.post(p.LaunchRunner(request_id="r1", session_id=None, workspace=str(ws / "sub")))
        (result,) = await server.wait_for(p.LaunchResult)
        assert result.runner_id and launcher.processes[0].cwd == str(ws / "sub")

    await _run(tmp_path, body, workspace_roots=[str(ws)])


@pytest.mark.parametrize("where", ["elsewhere", "sibling-prefix", "relative", "none"])
async def test_workspace_not_allowed(tmp_path, ws, where, autojump_clock):
    other = {"elsewhere": str(tmp_path), "sibling-prefix": str(ws) + "-2", "relative": "ws",
             "none": None}[where]

    async def body(host, link, server, launcher):
        host.allow_workspace(str(ws))
        link.post(p.LaunchRunner(request_id="r1", session_id="conv_1", workspace=other))
        (result,) = await server.wait_for(p.LaunchResult)
        assert result.error_code == "workspace_not_allowed" and result.runner_id is None
        assert launcher.processes == [] and server.of(p.RunnerCredential) == []

    await _run(tmp_path, body)


async def test_crashed_runner_is_replaced_with_a_new_id_and_the_same_env(tmp_path, ws, autojump_clock):
    async def body(host, link, server, launcher):
        host.allow_workspace(str(ws))
        host.set_session_env("conv_1", {"OPENAI_BASE_URL": "http://mock-1/v1"})
        link.post(p.LaunchRunner(request_id="r1", session_id="conv_1", workspace=str(ws)))
        (result,) = await server.wait_for(p.LaunchResult)
        await trio.sleep(5)
        launcher.processes[0].crash()
        launched = await server.wait_for(p.RunnerLaunched, 2)
        first, second = launcher.processes
        assert launched[1].runner_id != result.runner_id and launched[1].pid == second.pid
        assert second.env["OPENAI_BASE_URL"] == "http://mock-1/v1" and second.cwd == str(ws)
        (exited,) = server.of(p.RunnerExited)
        assert exited.runner_id == result.runner_id and exited.signal == 9 and not exited.gave_up
        assert host.live_runners() == [launched[1].runner_id]

    await _run(tmp_path, body)


async def test_idle_runner_ends_and_is_not_restarted(tmp_path, ws, autojump_clock):
    async def body(host, link, server, launcher):
        host.allow_workspace(str(ws))
        link.post(p.LaunchRunner(request_id="r1", session_id="conv_1", workspace=str(ws)))
        await server.wait_for(p.LaunchResult)
        proc = launcher.processes[0]
        for _ in range(5):  # used every 50 s: stays
            await trio.sleep(50)
            proc.use()
        assert proc.alive
        start = trio.current_time()
        await server.wait_for(p.RunnerExited)
        assert 100 <= trio.current_time() - start <= 100 + 25 + 1  # unused for the timeout (+ one check)
        assert not proc.alive and proc.signals[0] == 15
        await trio.sleep(600)
        assert len(launcher.processes) == 1 and host.live_runners() == []
        assert host.idle_since is not None and host.idle_since <= trio.current_time() - 600

    await _run(tmp_path, body, idle_timeout=100)


async def test_at_capacity(tmp_path, ws, autojump_clock):
    async def body(host, link, server, launcher):
        host.allow_workspace(str(ws))
        link.post(p.LaunchRunner(request_id="r1", session_id="a", workspace=str(ws)))
        await server.wait_for(p.LaunchResult)
        link.post(p.LaunchRunner(request_id="r2", session_id="b", workspace=str(ws)))
        results = await server.wait_for(p.LaunchResult, 2)
        assert results[1].error_code == "at_capacity"

    await _run(tmp_path, body, capacity=1)


async def test_shutdown_stops_every_runner_at_once(tmp_path, ws, autojump_clock):
    launcher = FakeLauncher()
    host, link = _host(tmp_path, launcher, shutdown_grace=2.0)
    server = FakeServer()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_fake_server, link, server)
        host_scope = trio.CancelScope()

        async def run_host():
            with host_scope:
                await host.run()

        nursery.start_soon(run_host)
        await trio.sleep(0.1)
        host.allow_workspace(str(ws))
        for i in range(3):
            link.post(p.LaunchRunner(request_id=f"r{i}", session_id=f"s{i}", workspace=str(ws)))
        await server.wait_for(p.LaunchResult, 3)
        for proc in launcher.processes:  # ignore TERM: only KILL ends them
            proc.send_signal_group = _stubborn(proc)
        start = trio.current_time()
        host_scope.cancel()
        while any(p_.alive for p_ in launcher.processes):
            await trio.sleep(0.01)
        assert trio.current_time() - start <= 2.5  # one grace, not three
        assert all(p_.signals[:2] == [15, 9] for p_ in launcher.processes)
        nursery.cancel_scope.cancel()


def _stubborn(proc):
    def send(sig: int) -> None:
        proc.signals.append(int(sig))
        if sig == 9:
            proc._end(-9)
    return send


def test_runner_env_allow_list():
    env = runner_env({"PATH": "/bin", "LC_ALL": "C", "SSL_CERT_FILE": "/ca", "OPENAI_X": "1",
                      "OMNIGENT_RUNNER_WAIT": "5", "OMNIGENT_REMOTE_AUTH_TOKEN": "t",
                      "OMNIGENT_SERVER_TOKEN": "s", "OMNIGENT_HOST_SECRET": "h", "AWS_SECRET": "a",
                      "MY_TOOL": "m", "OMNIGENT_RUNNER_ENV_PASSTHROUGH": "MY_TOOL,OMNIGENT_SERVER_TOKEN"},
                     {"OPENAI_API_KEY": "k", "OMNIGENT_HOST_SECRET": "h2", "AWS_SECRET": "a2"})
    assert env == {"PATH": "/bin", "LC_ALL": "C", "SSL_CERT_FILE": "/ca", "OPENAI_X": "1",
                   "OMNIGENT_RUNNER_WAIT": "5", "MY_TOOL": "m", "OPENAI_API_KEY": "k",
                   "OMNIGENT_RUNNER_ENV_PASSTHROUGH": "MY_TOOL,OMNIGENT_SERVER_TOKEN"}


async def test_serves_session_while_replacing_not_after_idle_end(tmp_path, ws, autojump_clock):
    async def body(host, link, server, launcher):
        host.allow_workspace(str(ws))
        assert not host.serves_session("conv_1")
        link.post(p.LaunchRunner(request_id="r1", session_id="conv_1", workspace=str(ws)))
        await server.wait_for(p.LaunchResult)
        assert host.serves_session("conv_1") and not host.serves_session("conv_2")
        launcher.processes[0].crash()
        await server.wait_for(p.RunnerExited)
        assert host.serves_session("conv_1")  # between the crash and the replacement too
        await server.wait_for(p.RunnerLaunched, 2)
        await server.wait_for(p.RunnerExited, 2)  # the replacement, unused, ends
        await trio.sleep(1)
        assert not host.serves_session("conv_1")

    await _run(tmp_path, body, idle_timeout=100)


async def test_a_slow_start_is_not_idleness(tmp_path, ws, autojump_clock):
    launcher = FakeLauncher()
    host, link = _host(tmp_path, launcher, idle_timeout=10, startup_timeout=60)
    server = FakeServer()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(serve_fake_server, link, server, online=False))  # no hello yet
        await nursery.start(host.run)
        host.allow_workspace(str(ws))
        link.post(p.LaunchRunner(request_id="r1", session_id="s", workspace=str(ws)))
        (result,) = await server.wait_for(p.LaunchResult)
        await trio.sleep(30)  # importing for three idle timeouts
        assert launcher.processes[0].alive
        link.post(p.RunnerOnline(runner_id=result.runner_id))
        await server.wait_for(p.RunnerExited)  # unused once online: it ends
        assert trio.current_time() - 30 < 10 + 3 + 1
        nursery.cancel_scope.cancel()
