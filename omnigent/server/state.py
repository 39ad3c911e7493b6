"""Everything a request handler may touch, in one object passed to create_app."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field

import trio

import protocol as p

from ..link import LinkEnd
from ..store import Store
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
    token: str
    loopback_only: bool = True
    require_client_token: bool = False
    ping_interval: float = 1.0
    ping_allowance: float = 3.0
    hello_timeout: float = 10.0
    shutting_down: trio.Event = field(default_factory=trio.Event)
    host_events: HostEvents = field(default_factory=HostEvents)

    def token_ok(self, authorization: str | None) -> bool:
        if not authorization or not authorization.startswith("Bearer "):
            return False
        return hmac.compare_digest(authorization[7:].encode(), self.token.encode())
