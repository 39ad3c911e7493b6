"""Everything a request handler may touch, in one object passed to create_app."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field

import trio

import protocol as p

from ..link.memory import LinkEnd
from ..link.runner_secrets import bearer
from ..store import Store
from .guard import Guard
from .hub import EventHub
from .registry import LOCAL_HOST, RunnerRegistry
from .turns import TurnService


class HostEvents:
    """What the server tells the host(s): a runner is online, must be killed, or must be launched.

    Each frame goes to the host that launched that runner only: a remote
    host's live link (`registry.hosts`), or for runners of the in-process
    host (`host_local`, or a runner no host announced) the in-process links
    in `links`. A frame for a host whose link is down is dropped: the host
    re-announces its runners when it reconnects.
    """

    def __init__(self, registry: RunnerRegistry | None = None) -> None:
        self.links: list[LinkEnd] = []   # the in-process host's links (memory channels)
        self.registry = registry

    def _links_for(self, runner_id: str) -> list[LinkEnd]:
        host_id = self.registry.host_of(runner_id) if self.registry is not None else LOCAL_HOST
        if host_id == LOCAL_HOST or self.registry is None:
            return self.links
        conn = self.registry.hosts.get(host_id)
        return [conn.link] if conn is not None else []

    def runner_online(self, runner_id: str) -> None:
        for link in self._links_for(runner_id):
            link.post(p.RunnerOnline(runner_id=runner_id))

    def kill_runner(self, runner_id: str, reason: str) -> None:
        for link in self._links_for(runner_id):
            link.post(p.KillRunner(runner_id=runner_id, reason=reason))

    def launch_runner(self, host_id: str, frame: p.LaunchRunner) -> bool:
        """Post a launch to that host; False when its link is down."""
        if host_id == LOCAL_HOST:
            links = self.links
        else:
            conn = self.registry.hosts.get(host_id) if self.registry is not None else None
            links = [conn.link] if conn is not None else []
        for link in links:
            link.post(frame)
        return bool(links)


@dataclass
class ServerState:
    store: Store
    hub: EventHub
    registry: RunnerRegistry
    turns: TurnService
    # The client token: None leaves client routes open (`omnigent server` on
    # loopback without --token, which says so). It never opens a runner route:
    # runners present the secret bound to their own id (runner_link).
    token: str | None
    guard: Guard = field(default_factory=Guard)
    ping_interval: float = 1.0
    ping_allowance: float = 3.0
    hello_timeout: float = 10.0
    # a runner may dial before its host's credential frame is read; the frame is sent before
    # the launch, so the skew is milliseconds, and a junk peer is held no longer than this
    credential_wait: float = 1.0
    reconnect_probe: float = 1.0   # a second connection for an online id: the old one's chance to answer
    shutting_down: trio.Event = field(default_factory=trio.Event)
    host_events: HostEvents = field(default_factory=HostEvents)
    # explicit runners registered with `isolate: true`: each may be bound to one session only
    isolated_runners: set[str] = field(default_factory=set)
    launch_timeout: float = 30.0   # POST /v1/hosts/{id}/runners waits this long for the LaunchResult
    # LaunchRunner requests waiting for their LaunchResult, by request id
    launches: dict[str, trio.MemorySendChannel[p.LaunchResult]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.host_events.registry is None:
            self.host_events.registry = self.registry

    def client_token_ok(self, authorization: str | None) -> bool:
        if self.token is None:
            return True
        presented = bearer(authorization)
        return presented is not None and hmac.compare_digest(presented.encode(), self.token.encode())
