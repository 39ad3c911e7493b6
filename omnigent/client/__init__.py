"""The async client of an omnigent server: the public SDK (`omnigent_client`) and the CLI's client.

A small public surface over private modules: `OmnigentClient` and its
namespaces, `SessionsChat`, the typed resources and events, and the errors.
"""

from ._chat import SessionsChat
from ._errors import (
    APIStatusError,
    AuthenticationError,
    ConflictError,
    APIConnectionError,
    InvalidInputError,
    NotFoundError,
    OmnigentError,
    ProtocolError,
    ServerError,
    TurnFailedError,
)
from ._events import (
    Event,
    Heartbeat,
    InputConsumed,
    ItemDone,
    ResponseCancelled,
    ResponseCompleted,
    ResponseCreated,
    ResponseFailed,
    RunnerLost,
    Resync,
    RunnerRebound,
    SessionStatus,
    StreamReset,
    TextDelta,
    TurnInterrupted,
    TurnRetried,
    message_text,
)
from ._files import FilesNamespace, SessionFiles
from ._hosts import HostsNamespace
from ._sessions import NOT_GIVEN, SessionsNamespace
from ._stream import SessionStream
from ._types import File, Host, HostCredential, LaunchedRunner, QueryResult, Session, SessionListItem
from .client import OmnigentClient, RunnersNamespace, TurnResult

__all__ = [
    "APIConnectionError", "APIStatusError", "AuthenticationError", "ConflictError", "Event", "File",
    "FilesNamespace", "Heartbeat", "Host", "HostCredential", "HostsNamespace", "InputConsumed",
    "InvalidInputError", "ItemDone", "LaunchedRunner", "NOT_GIVEN", "NotFoundError", "OmnigentClient",
    "OmnigentError", "ProtocolError", "QueryResult", "ResponseCancelled", "ResponseCompleted",
    "ResponseCreated", "ResponseFailed", "Resync", "RunnerLost", "RunnerRebound", "RunnersNamespace",
    "ServerError", "Session", "SessionFiles", "SessionListItem", "SessionStatus", "SessionStream",
    "SessionsChat", "SessionsNamespace", "StreamReset", "TextDelta", "TurnFailedError",
    "TurnInterrupted", "TurnResult", "TurnRetried", "message_text",
]
