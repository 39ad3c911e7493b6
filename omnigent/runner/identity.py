"""An early runner's identity: read from a pipe before it dials.

An early runner (`omnigent.tree.early`, `OMNIGENT_RUNNER_IDENTITY_FD` set)
is spawned by the CLI before its host exists: it starts importing at once
and reads its identity (the environment its host gives a runner, and its
log path) from that pipe before it dials. EOF with nothing on the pipe
means it was not needed: it exits 0. Until then its config is `PENDING`.
"""

from __future__ import annotations

import json
import os
import sys

import trio

from ..config.timeline import mark
from ._log import log
from .config import Config, ConfigError, load_config
from .state import EXIT_OK, EXIT_USAGE, RunnerState

IDENTITY_FD_VAR = "OMNIGENT_RUNNER_IDENTITY_FD"  # tree.early's pipe
PENDING = Config("http://pending.invalid", "pending", "")  # an early runner's, until its identity comes


class IdentityMixin(RunnerState):
    """Reading the identity pipe (stoppable like any phase)."""

    async def receive_identity(self, fd: int) -> int | None:
        """An early runner's identity from its pipe (tree.early); an exit code when there is none.

        Sets the environment its host gives a runner (id, secret, server URL,
        tool policy), moves stdout and stderr to its log, and loads the config.
        """
        data = b""
        with self._stoppable():
            try:
                stream = trio.lowlevel.FdStream(fd)
            except OSError as exc:
                log(f"cannot read the identity pipe: {exc}")
                return EXIT_USAGE
            async with stream:
                try:
                    while chunk := await stream.receive_some(65536):
                        data += chunk
                except (OSError, trio.BrokenResourceError):
                    pass
        if self.stopping:
            return self.exit_code
        if not data:
            return EXIT_OK  # not adopted: its launcher needed no runner after all
        try:
            identity = json.loads(data)
            for key, value in identity["env"].items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            _reopen_output(identity["log_path"])
        except (ValueError, KeyError, TypeError, AttributeError, OSError) as exc:
            log(f"bad identity on the identity pipe: {type(exc).__name__}")
            return EXIT_USAGE
        os.environ.pop(IDENTITY_FD_VAR, None)
        try:
            self.config = load_config(os.environ)
        except ConfigError as exc:
            log(f"omnigent runner: {exc}")
            return EXIT_USAGE
        mark("runner.identity")
        return None


def _reopen_output(log_path: str) -> None:
    """stdout and stderr to the log (append, 0600), as the host opens it for the runners it spawns."""
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
