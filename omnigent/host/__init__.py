"""The host: a supervised pool of runner processes for one server."""

from .launching import runner_argv
from .pool import Host

__all__ = ["Host", "runner_argv"]
