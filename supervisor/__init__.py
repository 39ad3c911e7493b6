"""Generic trio supervision: child specs, restart policies, process children, lifecycle events.

Imports only trio and the standard library; knows nothing about omnigent.
"""

from .events import ChildExited, ChildInfo, Event, GaveUp, Restart
from .policy import RestartPolicy, RestartTracker
from .process import (
    Launcher,
    ProcessConfig,
    ProcessHandle,
    TrioLauncher,
    TrioProcessHandle,
    describe_returncode,
    process_child,
    read_log_tail,
)
from .tree import ChildContext, ChildSpec, Supervisor, current_child

__all__ = [
    "ChildContext",
    "ChildExited",
    "ChildInfo",
    "ChildSpec",
    "Event",
    "GaveUp",
    "Launcher",
    "ProcessConfig",
    "ProcessHandle",
    "Restart",
    "RestartPolicy",
    "RestartTracker",
    "Supervisor",
    "TrioLauncher",
    "TrioProcessHandle",
    "current_child",
    "describe_returncode",
    "process_child",
    "read_log_tail",
]
