"""`client.hosts` against a real `omnigent server --runners 0`, under trio and under asyncio.

The same flow runs as a trio test and as an `@pytest.mark.asyncio` one (as in
test_sdk_server.py): register, list, get (offline), a launch on the offline
host (409 `host_offline`), revoke, then 404. The host's secret is in no
`repr()` and no log line. A trio-only test connects the host for real
(`run_host_link`, a fake pool answering `LaunchRunner`) to see a launch
succeed and a refused workspace come back as 403 `workspace_not_allowed`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import httpx
import pytest
import sniffio
import trio

import protocol as p
from omnigent.client._hosts import _launch_timeout
from omnigent.host.ws_link import run_host_link
from omnigent.link.memory import memory_link
from omnigent_client import (
    AuthenticationError,
    ConflictError,
    Host,
    HostCredential,
    LaunchedRunner,
    NotFoundError,
    OmnigentClient,
)
from tests.support.processes import omnigent_server


@pytest.fixture(scope="module")
def hosts_server(tmp_path_factory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("sdk-hosts-home")
    env = {**os.environ, "HOME": str(home)}
    env.pop("OMNIGENT_REMOTE_AUTH_TOKEN", None)
    with omnigent_server(env, "--runners", "0") as url:
        yield url


class _RecordingAuth(httpx.Auth):
    """Notes which async library runs each request the SDK sends."""

    def __init__(self) -> None:
        self.libraries: set[str] = set()

    async def async_auth_flow(self, request):
        self.libraries.add(sniffio.current_async_library())
        yield request


async def _flow(url: str, caplog: pytest.LogCaptureFixture) -> set[str]:
    """Every host route but a successful launch; returns the async libraries seen."""
    auth = _RecordingAuth()
    caplog.set_level(logging.DEBUG)  # httpx and httpcore log every request at DEBUG
    async with OmnigentClient(url, auth=auth) as client:
        cred = await client.hosts.register(name="sdk-box", workspace_roots=["/srv/work"], capacity=2)
        assert isinstance(cred, HostCredential) and cred.host_id.startswith("host_") and cred.host_secret
        for shown in (repr(cred), str(cred), f"{cred}", repr([cred])):
            assert cred.host_id in shown and cred.host_secret not in shown
        assert not hasattr(cred, "raw")

        listed = await client.hosts.list()
        assert all(isinstance(h, Host) for h in listed)
        assert cred.host_id in [h.host_id for h in listed]
        host = await client.hosts.get(cred.host_id)
        assert (host.host_id, host.name, host.online, host.status) == (cred.host_id, "sdk-box", False, "offline")
        assert (host.runners, host.capacity, host.workspace_roots) == ([], 2, ["/srv/work"])
        assert host.raw["generation"] == host.generation == 0

        with pytest.raises(ConflictError) as offline:
            await client.hosts.launch_runner(cred.host_id, workspace="/srv/work")
        assert (offline.value.status_code, offline.value.code) == (409, "host_offline")
        assert "offline" in offline.value.message
        with pytest.raises(NotFoundError):  # the session is looked up first
            await client.hosts.launch_runner(cred.host_id, session_id="conv_nope")

        assert await client.hosts.revoke(cred.host_id) is None
        with pytest.raises(NotFoundError) as gone:
            await client.hosts.get(cred.host_id)
        assert (gone.value.status_code, gone.value.code) == (404, "not_found")
        assert cred.host_id not in [h.host_id for h in await client.hosts.list()]
        for again in (client.hosts.revoke(cred.host_id), client.hosts.launch_runner(cred.host_id)):
            with pytest.raises(NotFoundError):
                await again
        with pytest.raises(NotFoundError):
            await client.hosts.get("host_" + "0" * 32)
    assert caplog.text and cred.host_secret not in caplog.text
    return auth.libraries


@pytest.mark.asyncio
async def test_hosts_under_asyncio(hosts_server, caplog):
    assert sniffio.current_async_library() == "asyncio"
    assert await _flow(hosts_server, caplog) == {"asyncio"}


async def test_hosts_under_trio(hosts_server, caplog):
    assert await _flow(hosts_server, caplog) == {"trio"}


async def _fake_pool(host_end, refuse: str) -> None:
    """Answers `LaunchRunner`: a refusal for workspace `refuse`, else a runner id (nothing starts)."""
    async for frame in host_end.receive:
        if isinstance(frame, p.LaunchRunner):
            if frame.workspace == refuse:
                host_end.post(p.LaunchResult(request_id=frame.request_id, error_code="workspace_not_allowed",
                                             message=f"{refuse} is outside this host's roots"))
            else:
                host_end.post(p.LaunchResult(request_id=frame.request_id, runner_id="runner_sdkfake"))


async def test_launch_on_a_connected_host(hosts_server):
    async with OmnigentClient(hosts_server) as client:
        cred = await client.hosts.register(workspace_roots=["/srv/work"])
        server_end, host_end = memory_link()
        hello = lambda: p.HostHello(host_id=cred.host_id, pid=os.getpid(),  # noqa: E731
                                    protocol_version=p.PROTOCOL_VERSION, workspace_roots=["/srv/work"])
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: run_host_link(
                hosts_server, cred.host_id, cred.host_secret, server_end, hello, task_status=task_status))
            nursery.start_soon(_fake_pool, host_end, "/elsewhere")
            try:
                assert (await client.hosts.get(cred.host_id)).online is True
                with trio.fail_after(30):
                    launched = await client.hosts.launch_runner(cred.host_id, workspace="/srv/work/a")
                assert launched == LaunchedRunner(runner_id="runner_sdkfake", host_id=cred.host_id,
                                                  session_id=None)
                with pytest.raises(AuthenticationError) as refused, trio.fail_after(30):
                    await client.hosts.launch_runner(cred.host_id, workspace="/elsewhere")
                assert (refused.value.status_code, refused.value.code) == (403, "workspace_not_allowed")
                assert "/elsewhere" in refused.value.message
            finally:
                nursery.cancel_scope.cancel()
        await client.hosts.revoke(cred.host_id)


def test_a_launch_may_take_the_servers_whole_wait():
    # the server answers 408 after 30 s: the request's read timeout outlasts it
    assert _launch_timeout(httpx.Timeout(30.0)).read == 40.0
    assert _launch_timeout(httpx.Timeout(30.0)).connect == 30.0
    assert _launch_timeout(httpx.Timeout(120.0)).read == 120.0
    assert _launch_timeout(httpx.Timeout(None)).read is None


async def test_the_daemons_registration_goes_through_the_sdk(nursery, tmp_path):
    """`register_host` (the daemon's and `ensure_daemon`'s `POST /v1/hosts`): bearer, roots, one-line errors."""
    import socket

    from omnigent.host.daemon_client import RegisterError, register_host
    from omnigent.server.serve import run_server
    from omnigent.server.sockets import bind_socket
    from omnigent.store import Store

    store = Store(tmp_path / "chat.db")
    handle = await nursery.start(lambda task_status: run_server(
        store, bind_socket(), token="tok", task_status=task_status))
    try:
        with pytest.raises(RegisterError) as refused:
            await register_host(handle.url, token=None)
        assert str(refused.value).startswith(f"{handle.url} refused to register this host (401): ")
        assert "\n" not in str(refused.value)
        (tmp_path / "root").mkdir()
        (tmp_path / "link").symlink_to(tmp_path / "root")
        host_id, secret = await register_host(handle.url, token="tok", workspace_roots=[str(tmp_path / "link")])
        assert secret and host_id.startswith("host_")
        row = store.get_host(host_id)
        assert (row["name"], row["workspace_roots"]) == (socket.gethostname(), [str((tmp_path / "root").resolve())])
        async with OmnigentClient(handle.url, token="tok") as client:
            assert (await client.hosts.get(host_id)).online is False
    finally:
        await handle.aclose()
        store.close()
    with pytest.raises(RegisterError) as unreachable:
        await register_host(handle.url, token="tok")
    assert str(unreachable.value).startswith(
        f"cannot register this host: cannot reach the omnigent server at {handle.url}")
