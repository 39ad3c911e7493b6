"""The API's resources as frozen dataclasses, built leniently from the server's JSON.

A newer server may add fields: they are ignored here and kept in `.raw`, so
an SDK never breaks on a richer answer. Missing optional fields are None.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

_T = TypeVar("_T")


def _build(cls: type[_T], data: dict[str, Any]) -> _T:
    names = {f.name for f in dataclasses.fields(cls) if f.init and f.name != "raw"}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in names}, raw=dict(data))  # type: ignore[call-arg]


@dataclass(frozen=True)
class SessionListItem:
    """A session as `GET /v1/sessions` lists it."""

    id: str
    agent_id: str | None = None
    agent_name: str | None = None
    status: str = "idle"  # idle | running | waiting | failed
    created_at: float | None = None
    updated_at: float | None = None
    title: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    runner_id: str | None = None
    runner_online: bool = False
    host_id: str | None = None
    reasoning_effort: str | None = None
    workspace: str | None = None
    permission_mode: str | None = None  # ask | auto | deny; None: the agent spec's
    forked_from: str | None = None  # the session this one was forked from
    snippet: str | None = None  # a search hit (`sessions.list(search_query=)`): its best-matching text
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        return _build(cls, data)


@dataclass(frozen=True)
class Session(SessionListItem):
    """A session's full snapshot (`GET /v1/sessions/{id}`).

    `last_sequence_number` is the newest event in its stream when the snapshot
    was taken: `sessions.stream(id, after=s.last_sequence_number)` continues
    from this snapshot with no gap and no duplicate.
    """

    llm_model: str | None = None
    harness: str | None = None
    model_override: str | None = None
    items: list[dict[str, Any]] = field(default_factory=list)
    last_sequence_number: int | None = None
    # summed over the session's turns: {input_tokens, output_tokens, total_tokens, turns}
    usage: dict[str, Any] | None = None


@dataclass(frozen=True)
class File:
    """A file stored in a session (`/v1/sessions/{id}/files`)."""

    id: str
    filename: str
    bytes: int
    created_at: float | None = None
    content_type: str | None = None
    session_id: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> File:
        meta = data["metadata"] if isinstance(data.get("metadata"), dict) else {}
        merged = {**meta, **{k: v for k, v in data.items() if k != "metadata"}}
        merged.setdefault("filename", merged.get("name", ""))
        merged.setdefault("bytes", 0)
        return _build(cls, merged)


@dataclass(frozen=True)
class QueryResult:
    """What `SessionsChat.query` returns: the answer's text and how the turn ended."""

    text: str
    status: str = "completed"  # completed | cancelled
    turn_id: str | None = None
    files: list[File] = field(default_factory=list)


@dataclass(frozen=True)
class Host:
    """A host as `GET /v1/hosts` and `GET /v1/hosts/{id}` show it.

    `runners` are the ids of its runners online now; `capacity` 0 means no
    bound. The in-process host of `omnigent run` / `omnigent server --runners N`
    is `host_local`, listed while that server has one.
    """

    host_id: str
    name: str | None = None
    status: str = "offline"  # online | offline
    online: bool = False
    runners: list[str] = field(default_factory=list)
    capacity: int = 0
    workspace_roots: list[str] = field(default_factory=list)
    generation: int = 0
    last_seen_at: float | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Host:
        return _build(cls, data)


@dataclass(frozen=True)
class HostCredential:
    """What `hosts.register` returns: the new host's id and its secret, which the server shows once.

    The secret opens the host's websocket (`Authorization: Bearer`); the
    server keeps only its hash. It is left out of `repr()` (and so of any log
    line or traceback that prints the credential), and not kept in a `raw`.
    """

    host_id: str
    host_secret: str = field(repr=False)


@dataclass(frozen=True)
class LaunchedRunner:
    """What `hosts.launch_runner` returns: the runner the host started (not yet online, maybe)."""

    runner_id: str
    host_id: str
    session_id: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchedRunner:
        return _build(cls, data)
