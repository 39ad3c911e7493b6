"""The host: a supervised pool of runner processes for one server."""

from .pool import Host, runner_argv

__all__ = ["Host", "runner_argv"]
