"""The frames of the host<->server link (`/v1/hosts/{host_id}/ws`): a host's runners and their launches.

A host daemon starts and kills runner processes on the server's behalf and
reports what happened to them; the runners then dial the server themselves
(`runner_frames.py`). Every frame names the runner it is about, and the
link's generation (`HostHelloAck`) lets the server tell a late frame of an
older link from a current one. `HOST_FRAMES` lists every class here for the
codec's registry.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from .frame import Frame


@dataclass(frozen=True)
class HostHello(Frame):
    """Host -> server, the first frame on a host link (`/v1/hosts/{host_id}/ws`, bearer = host secret).

    `workspace_roots` are the directories this host's user allowed runners to
    start in (placement of sessions with a workspace considers them);
    `runners` are the ids of runner processes still alive on this host, so a
    host that reconnects (server restart, network blip) re-announces them;
    `capacity` is how many runners it will run at once (0: no stated bound).
    """

    kind: ClassVar[str] = "host.hello"
    host_id: str
    pid: int
    protocol_version: int
    name: str = ""
    workspace_roots: list[str] = dataclasses.field(default_factory=list)
    runners: list[str] = dataclasses.field(default_factory=list)
    capacity: int = 0
    # the most this host lets its runners' tools do (`omnigent host --permissions`):
    # the effective mode of a session placed here is never above it
    permissions: str = "ask"


@dataclass(frozen=True)
class HostHelloAck(Frame):
    """Server -> host: the link is accepted; `generation` is this link's ownership generation.

    The server bumps a host's generation every time it accepts a link for it,
    so frames about runners from an older link of the same host are known late.
    """

    kind: ClassVar[str] = "host.hello_ack"
    ping_interval: float
    generation: int


@dataclass(frozen=True)
class RunnerCredential(Frame):
    """Host -> server, before the launch: the sha256 (hex) of the secret bound to `runner_id`.

    The host mints the secret and gives it only to the runner's environment;
    the server learns just its hash. The runner may dial before the server has
    read this frame: the server waits a bounded time for the credential.
    """

    kind: ClassVar[str] = "host.runner_credential"
    runner_id: str
    secret_hash: str


@dataclass(frozen=True)
class RunnerLaunched(Frame):
    """Host -> server: a runner process exists (before it said hello)."""

    kind: ClassVar[str] = "host.runner_launched"
    runner_id: str
    pid: int
    log_path: str = ""


@dataclass(frozen=True)
class RunnerExited(Frame):
    """Host -> server: a runner process ended; `reason` is one human line."""

    kind: ClassVar[str] = "host.runner_exited"
    runner_id: str
    code: int | None
    signal: int | None
    reason: str
    log_tail: str = ""
    gave_up: bool = False


@dataclass(frozen=True)
class RunnerOnline(Frame):
    """Server -> host: that runner said hello; the supervisor may call it started."""

    kind: ClassVar[str] = "host.runner_online"
    runner_id: str


@dataclass(frozen=True)
class LaunchRunner(Frame):
    """Server -> host: start one runner (for `session_id`, in `workspace`, when given).

    The host answers with a `LaunchResult` carrying the same `request_id`. It
    decides itself whether `workspace` is allowed (`workspace_not_allowed`
    otherwise); the session id lets it give that runner the model endpoint
    and key that the session's own client handed it locally.
    """

    kind: ClassVar[str] = "host.launch_runner"
    request_id: str
    session_id: str | None = None
    workspace: str | None = None


@dataclass(frozen=True)
class LaunchResult(Frame):
    """Host -> server: the answer to a `LaunchRunner`; `runner_id` or an error code.

    Sent only after the runner's `RunnerCredential` and `RunnerLaunched`
    frames (same link, same order), and after the launch line is in the host's
    log. Error codes: `workspace_not_allowed`, `at_capacity`, `launch_failed`.
    """

    kind: ClassVar[str] = "host.launch_result"
    request_id: str
    runner_id: str | None = None
    error_code: str | None = None
    message: str = ""


@dataclass(frozen=True)
class KillRunner(Frame):
    """Server -> host: kill that runner's process group (e.g. it stopped answering pings)."""

    kind: ClassVar[str] = "host.kill_runner"
    runner_id: str
    reason: str


HOST_FRAMES: tuple[type[Frame], ...] = (
    HostHello, HostHelloAck, RunnerCredential, RunnerLaunched, RunnerExited, RunnerOnline, LaunchRunner,
    LaunchResult, KillRunner,
)

__all__ = [
    "HOST_FRAMES",
    "HostHello", "HostHelloAck", "KillRunner", "LaunchResult", "LaunchRunner", "RunnerCredential",
    "RunnerExited", "RunnerLaunched", "RunnerOnline",
]
