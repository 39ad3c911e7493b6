"""Hosts with real runner processes: two `Host` pools over `run_host_link`, and launches on demand.

A real server on a real socket (no in-process host), the real client link,
real `python -m omnigent.runner` processes against the mock LLM, the real
clock with bounded waits. Every process started here is killed in a `finally`.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
import trio

import protocol as p
from omnigent.agents import bundle_bytes
from omnigent.client import OmnigentClient, SessionsChat
from omnigent.host.launching import runner_argv
from omnigent.host.pool import Host
from omnigent.host.ws_link import run_host_link
from omnigent.link.memory import memory_link
from omnigent.link.runner_secrets import ENV_VAR, hash_secret, mint_runner_id, mint_secret
from omnigent.server.serve import run_server
from omnigent.server.sockets import bind_socket
from omnigent.store import Store
from tests.conftest import configure_mock_llm

MODEL = "hosts-model"
WAIT = 60


@pytest.fixture
async def server(nursery, tmp_path):
    store = Store(tmp_path / "chat.db")
    handle = await nursery.start(lambda task_status: run_server(
        store, bind_socket(), token=None, runner_wait=20.0, ping_interval=0.5, host_grace=2.0,
        task_status=task_status))
    handle.store = store
    yield handle
    await handle.aclose()
    store.close()


@pytest.fixture
def bundle(tmp_path) -> bytes:
    path = tmp_path / "hosts_agent.yaml"
    path.write_text(f"name: hosts_agent\nprompt: be brief\nexecutor:\n  model: {MODEL}\n")
    return bundle_bytes(path)


async def register(url: str, **body) -> tuple[str, str]:
    async with httpx.AsyncClient(base_url=url) as http:
        r = await http.post("/v1/hosts", json=body)
    assert r.status_code == 201, r.text
    return r.json()["host_id"], r.json()["host_secret"]


class RemoteHost:
    """A `Host` pool of fixed slots linked over the websocket, as a daemon would run it."""

    def __init__(self, url: str, host_id: str, secret: str, tmp: Path, env: dict[str, str], runners: int = 1):
        self.url, self.host_id, self.secret = url, host_id, secret
        server_end, host_end = memory_link()
        self.server_end = server_end
        self.pool = Host(url, host_end, log_dir=tmp / host_id, workspace=str(tmp), runners=runners, env=env)
        self.link_scope = trio.CancelScope()
        self.pool_scope = trio.CancelScope()

    def hello(self) -> p.HostHello:
        return p.HostHello(host_id=self.host_id, pid=os.getpid(), protocol_version=p.PROTOCOL_VERSION,
                           runners=list(self.pool._online))

    async def run(self, nursery: trio.Nursery) -> None:
        async def link(task_status=trio.TASK_STATUS_IGNORED):
            with self.link_scope:
                await run_host_link(self.url, self.host_id, self.secret, self.server_end, self.hello,
                                    backoff_cap=0.5, task_status=task_status)

        async def pool():
            with self.pool_scope:
                await self.pool.run()

        await nursery.start(link)
        nursery.start_soon(pool)

    def pids(self, server) -> list[int]:
        return [server.state.registry.pids[r] for r in server.state.registry.host_runners(self.host_id)]


async def hosts_view(url: str) -> dict[str, dict]:
    async with httpx.AsyncClient(base_url=url) as http:
        return {h["host_id"]: h for h in (await http.get("/v1/hosts")).json()["data"]}


async def until_runners(server, host_id: str, count: int) -> list[str]:
    registry = server.state.registry
    with trio.fail_after(WAIT):
        while len(registry.host_runners(host_id)) < count:
            await registry.wait_changed()
    return registry.host_runners(host_id)


async def test_two_hosts_one_dies_and_its_sessions_go_on_on_the_other(server, nursery, tmp_path, bundle,
                                                                      mock_credentials_env, mock_llm_server_url):
    configure_mock_llm(mock_llm_server_url, [{"text": "ANSWER"}] * 20, key=MODEL)
    hosts = []
    for name in ("a", "b"):
        host_id, secret = await register(server.url, name=name)
        hosts.append(RemoteHost(server.url, host_id, secret, tmp_path, mock_credentials_env))
    a, b = hosts
    try:
        for host in hosts:
            await host.run(nursery)
        ra = (await until_runners(server, a.host_id, 1))[0]
        rb = (await until_runners(server, b.host_id, 1))[0]
        view = await hosts_view(server.url)
        assert view[a.host_id]["online"] and view[a.host_id]["runners"] == [ra]
        assert view[b.host_id]["online"] and view[b.host_id]["runners"] == [rb]
        async with OmnigentClient(server.url) as client:
            sessions = [await client.sessions.create(bundle) for _ in range(4)]
            for s in sessions:
                with trio.fail_after(WAIT):
                    assert "ANSWER" in (await SessionsChat(namespace=client.sessions, session=s).query("hi")).text
            placed = {s.id: (await client.sessions.get(s.id)).runner_id for s in sessions}
            assert sorted(placed.values()) == sorted([ra, ra, rb, rb])  # least loaded first
            on_a = [sid for sid, rid in placed.items() if rid == ra]

            # host a dies: its link and its runner processes
            pids = a.pids(server)
            a.link_scope.cancel()
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            with trio.fail_after(WAIT):
                while a.host_id in server.state.registry.hosts or ra in server.state.registry.online:
                    await server.state.registry.wait_changed()
            a.pool_scope.cancel()
            assert not (await hosts_view(server.url))[a.host_id]["online"]

            for sid in on_a:
                with trio.fail_after(WAIT):
                    result = await SessionsChat(namespace=client.sessions, session=sid).query("still there?")
                assert "ANSWER" in result.text
                assert (await client.sessions.get(sid)).runner_id == rb
    finally:
        for host in hosts:
            host.link_scope.cancel()
            host.pool_scope.cancel()


class LaunchingHost:
    """A small fake daemon: answers `LaunchRunner` by launching a real runner process.

    `allowed` are the workspace roots it accepts; `capacity` how many it runs.
    """

    def __init__(self, url: str, host_id: str, env: dict[str, str], tmp: Path, *,
                 allowed: tuple[str, ...] = (), answer: bool = True) -> None:
        self.url, self.host_id, self.env, self.tmp = url, host_id, env, tmp
        self.allowed, self.answer = allowed, answer
        self.server_end, self.host_end = memory_link()
        self.procs: list[trio.Process] = []
        self.requests: list[p.LaunchRunner] = []

    async def serve(self) -> None:
        async with trio.open_nursery():
            async for frame in self.host_end.receive:
                if isinstance(frame, p.LaunchRunner):
                    self.requests.append(frame)
                    if self.answer:
                        await self._launch(frame)

    async def _launch(self, frame: p.LaunchRunner) -> None:
        workspace = frame.workspace or str(self.tmp)
        if not any(workspace == r or workspace.startswith(r + "/") for r in self.allowed):
            self.host_end.post(p.LaunchResult(request_id=frame.request_id, error_code="workspace_not_allowed",
                                              message=f"workspace {workspace} is not allowed on this host"))
            return
        runner_id, secret = mint_runner_id(), mint_secret()
        self.host_end.post(p.RunnerCredential(runner_id=runner_id, secret_hash=hash_secret(secret)))
        env = {**self.env, "OMNIGENT_SERVER_URL": self.url, "OMNIGENT_RUNNER_ID": runner_id, ENV_VAR: secret}
        log = open(self.tmp / f"{runner_id}.log", "wb")
        proc = await trio.lowlevel.open_process(runner_argv(env), env=env, cwd=workspace,
                                                stdin=subprocess.PIPE, stdout=log, stderr=log)
        log.close()
        self.procs.append(proc)
        self.host_end.post(p.RunnerLaunched(runner_id=runner_id, pid=proc.pid))
        self.host_end.post(p.LaunchResult(request_id=frame.request_id, runner_id=runner_id))

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                proc.kill()


async def test_launch_on_demand_binds_the_session_and_its_first_turn_waits_for_the_runner(
        server, nursery, tmp_path, bundle, mock_credentials_env, mock_llm_server_url):
    configure_mock_llm(mock_llm_server_url, [{"text": "LAUNCHED_OK"}] * 4, key=MODEL)
    work = tmp_path / "work"
    (work / "repo").mkdir(parents=True)
    host_id, secret = await register(server.url, name="launcher", capacity=1)
    fake = LaunchingHost(server.url, host_id, mock_credentials_env, tmp_path, allowed=(str(work),))
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=WAIT) as http:
            # offline first: 409 with "offline"
            r = await http.post(f"/v1/hosts/{host_id}/runners", json={})
            assert r.status_code == 409 and r.json()["error"]["code"] == "host_offline"
            assert "offline" in r.json()["error"]["message"]
            nursery.start_soon(fake.serve)
            await nursery.start(lambda task_status: run_host_link(
                server.url, host_id, secret, fake.server_end,
                lambda: p.HostHello(host_id=host_id, pid=os.getpid(), protocol_version=p.PROTOCOL_VERSION,
                                    workspace_roots=[str(work)], capacity=1),
                task_status=task_status))
            async with OmnigentClient(server.url) as client:
                session = await client.sessions.create(bundle)
                r = await http.post(f"/v1/hosts/{host_id}/runners",
                                    json={"session_id": session.id, "workspace": "/etc"})
                assert r.status_code == 403 and r.json()["error"]["code"] == "workspace_not_allowed"
                r = await http.post(f"/v1/hosts/{host_id}/runners",
                                    json={"session_id": session.id, "workspace": str(work / "repo")})
                assert r.status_code == 201, r.text
                launched = r.json()
                assert launched["host_id"] == host_id and launched["session_id"] == session.id
                got = (await http.get(f"/v1/sessions/{session.id}")).json()
                assert got["host_id"] == host_id and got["workspace"] == str(work / "repo")
                assert got["runner_id"] == launched["runner_id"]
                # posted before the runner is online: waits for it, answered by it
                with trio.fail_after(WAIT):
                    result = await SessionsChat(namespace=client.sessions, session=session.id).query("hi")
                assert "LAUNCHED_OK" in result.text
                status = (await http.get(f"/v1/runners/{launched['runner_id']}/status")).json()
                assert status["online"] is True
                r = await http.post(f"/v1/hosts/{host_id}/runners", json={})
                assert r.status_code == 409 and r.json()["error"]["code"] == "at_capacity"
                r = await http.post(f"/v1/hosts/{host_id}/runners", json={"session_id": "conv_nope"})
                assert r.status_code == 404
                r = await http.post("/v1/hosts/host_nope/runners", json={})
                assert r.status_code == 404
    finally:
        fake.kill_all()


async def test_a_host_that_never_answers_a_launch_is_408(server, nursery, tmp_path, mock_credentials_env):
    server.state.launch_timeout = 0.5
    host_id, secret = await register(server.url)
    fake = LaunchingHost(server.url, host_id, mock_credentials_env, tmp_path, answer=False)
    nursery.start_soon(fake.serve)
    await nursery.start(lambda task_status: run_host_link(
        server.url, host_id, secret, fake.server_end,
        lambda: p.HostHello(host_id=host_id, pid=os.getpid(), protocol_version=p.PROTOCOL_VERSION),
        task_status=task_status))
    async with httpx.AsyncClient(base_url=server.url, timeout=WAIT) as http:
        r = await http.post(f"/v1/hosts/{host_id}/runners", json={"workspace": "/tmp"})
    assert r.status_code == 408 and r.json()["error"]["code"] == "launch_timeout"
    assert [f.workspace for f in fake.requests] == ["/tmp"]
    assert server.state.launches == {}


async def test_frames_posted_while_the_server_is_away_arrive_after_it_comes_back(nursery, tmp_path):
    store = Store(tmp_path / "chat.db")
    sock = bind_socket()
    port = sock.getsockname()[1]
    first = await nursery.start(lambda task_status: run_server(store, sock, token=None, ping_interval=0.2,
                                                               task_status=task_status))
    host_id, secret = await register(first.url)
    server_end, host_end = memory_link()
    acks: list[p.HostHelloAck] = []

    def hello() -> p.HostHello:
        return p.HostHello(host_id=host_id, pid=os.getpid(), protocol_version=p.PROTOCOL_VERSION)

    link_scope = trio.CancelScope()

    async def link(task_status=trio.TASK_STATUS_IGNORED):
        with link_scope:
            await run_host_link(first.url, host_id, secret, server_end, hello, backoff_cap=0.3,
                                task_status=task_status)

    acks.append(await nursery.start(link))
    await first.aclose()
    ids = [f"runner_{i:032x}" for i in range(3)]
    for rid in ids:  # while no server listens
        host_end.post(p.RunnerCredential(runner_id=rid, secret_hash=hash_secret("s" * 40)))
    second = await nursery.start(lambda task_status: run_server(store, bind_socket(port=port), token=None,
                                                                ping_interval=0.2, task_status=task_status))
    try:
        with trio.fail_after(WAIT):
            while not all(store.runner_credential(rid) for rid in ids):
                await second.state.registry.wait_changed()
        assert {store.runner_credential(rid)["host_id"] for rid in ids} == {host_id}
        assert store.get_host(host_id)["generation"] == 2
    finally:
        link_scope.cancel()
        await second.aclose()
        store.close()
