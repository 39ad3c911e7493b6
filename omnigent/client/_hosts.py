"""`client.hosts`: register, list, show and revoke hosts, and ask a host for a runner.

A host is a machine whose daemon (`omnigent host --server URL`) holds a
websocket to the server and starts runners there when asked. Registering
returns its id and secret once; the daemon keeps them. Each method is one
API call returning a typed resource; failures are the usual typed errors,
told apart by `.code`:

    launch_runner on a host that is not connected   ConflictError        code host_offline
    ... that runs `capacity` runners already         ConflictError        code at_capacity
    ... that failed to start the runner              ConflictError        code launch_failed
    ... outside the host's workspace roots           AuthenticationError  code workspace_not_allowed (403)
    ... that did not answer in time                  APIStatusError       code launch_timeout (408)
    any call on an unknown or revoked host           NotFoundError        code not_found
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

import httpx

from ._errors import ProtocolError
from ._http import Transport
from ._types import Host, HostCredential, LaunchedRunner

# The server waits this long for the host's answer to a launch before it says 408
# `launch_timeout`; the request may take that long, so its read timeout is at least this
# plus a margin, whatever the client's `timeout` is (an unbounded one stays unbounded).
LAUNCH_WAIT = 30.0
_LAUNCH_MARGIN = 10.0


def _path(host_id: str, tail: str = "") -> str:
    return f"/v1/hosts/{quote(host_id, safe='')}{tail}"


class HostsNamespace:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    async def register(self, *, name: str | None = None,
                       workspace_roots: Iterable[str | os.PathLike[str]] | None = None,
                       capacity: int | None = None) -> HostCredential:
        """A new host: its id and secret (shown this once; the server keeps only a hash).

        `workspace_roots` are absolute paths the host declares (sessions whose
        workspace lies under one may be placed on it); `capacity` bounds its
        runners (0 or None: no bound).
        """
        body: dict[str, Any] = {}
        if name is not None:
            body["name"] = name
        if workspace_roots is not None:
            body["workspace_roots"] = [os.fspath(root) for root in workspace_roots]
        if capacity is not None:
            body["capacity"] = capacity
        answer = await self._t.request("POST", "/v1/hosts", json=body)
        try:
            return HostCredential(host_id=str(answer["host_id"]), host_secret=str(answer["host_secret"]))
        except (KeyError, TypeError):
            raise ProtocolError("POST /v1/hosts: the answer has no host_id and host_secret") from None

    async def list(self) -> builtins.list[Host]:
        """Every host not revoked, online or not (`host_local` first, when there is one)."""
        body = await self._t.request("GET", "/v1/hosts")
        return [Host.from_dict(row) for row in body["data"]]

    async def get(self, host_id: str) -> Host:
        return Host.from_dict(await self._t.request("GET", _path(host_id)))

    async def revoke(self, host_id: str) -> None:
        """Revoke the host's secret: its link is closed (4003) and its runners dropped."""
        await self._t.request("DELETE", _path(host_id))

    async def launch_runner(self, host_id: str, *, session_id: str | None = None,
                            workspace: str | os.PathLike[str] | None = None) -> LaunchedRunner:
        """Ask the host to start a runner; with `session_id`, the server binds that session to it.

        `workspace` (absolute; default: the session's) is where the runner
        starts. Returns once the host has started it, not once it is online:
        `client.runners.status(runner_id)` says that, and a message posted
        meanwhile waits for it.
        """
        body: dict[str, Any] = {}
        if session_id is not None:
            body["session_id"] = session_id
        if workspace is not None:
            body["workspace"] = os.fspath(workspace)
        answer = await self._t.request("POST", _path(host_id, "/runners"), json=body,
                                       timeout=_launch_timeout(self._t.http.timeout))
        return LaunchedRunner.from_dict(answer)


def _launch_timeout(timeout: httpx.Timeout) -> httpx.Timeout:
    wait = LAUNCH_WAIT + _LAUNCH_MARGIN
    read = None if timeout.read is None else max(timeout.read, wait)
    return httpx.Timeout(connect=timeout.connect, read=read, write=timeout.write, pool=timeout.pool)


__all__ = ["HostsNamespace"]
