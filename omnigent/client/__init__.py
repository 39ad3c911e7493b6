"""The async client every front end (CLI, REPL, tests) uses to talk to a server."""

from .client import OmnigentClient, OmnigentError, TurnResult, message_text

__all__ = ["OmnigentClient", "OmnigentError", "TurnResult", "message_text"]
