"""The terminal front end of `omnigent run`: a REPL that is a client of a server."""

from .repl import Repl

__all__ = ["Repl"]
