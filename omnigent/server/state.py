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
from .registry import RunnerRegistry
from .turns import TurnService


class HostEvents:
    """What the server tells the host(s): a runner is online, or must be killed."""

    def __init__(self) -> None:
        self.links: list[LinkEnd] = []

    def runner_online(self, runner_id: str) -> None:
        for link in self.links:
            link.post(p.RunnerOnline(runner_id=runner_id))

    def kill_runner(self, runner_id: str, reason: str) -> None:
        for link in self.links:
            link.post(p.KillRunner(runner_id=runner_id, reason=reason))


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

    def client_token_ok(self, authorization: str | None) -> bool:
        if self.token is None:
            return True
        presented = bearer(authorization)
        return presented is not None and hmac.compare_digest(presented.encode(), self.token.encode())
