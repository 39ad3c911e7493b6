"""`nursery.start(host.run)` reports the Host, as `Host.run`'s task status declares (it used to
relay the supervisor's own value: the Supervisor, which mypy caught)."""

from __future__ import annotations

import trio

from tests.unit.test_host_on_demand import _host
from tests.support.fake_host_processes import FakeLauncher, FakeServer, serve_fake_server


async def test_start_reports_the_host(tmp_path, autojump_clock):
    host, server_end = _host(tmp_path, FakeLauncher())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_fake_server, server_end, FakeServer())
        assert await nursery.start(host.run) is host
        nursery.cancel_scope.cancel()
