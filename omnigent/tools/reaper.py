"""No tool descendant outlives its owner: subreapers, a parent-death signal, and a sweep.

How a tool's processes end, case by case:
- The tool's `bash` runs in a process group of its own with
  `PR_SET_PDEATHSIG=SIGKILL`: when the runner dies, by any signal, the kernel
  kills the bash.
- When a tool ends (normally, by timeout or by a cancel) its whole process
  group is killed (`cmd &`, `nohup cmd &` stay in that group).
- What left the group (`setsid cmd &`, a double fork into a new session)
  is reparented, once its parent exits, to the nearest *subreaper* above it:
  the runner calls `become_subreaper()` at start and
  `sweep_orphans(keep=running_tool_pids())` after each tool and at exit,
  which SIGKILLs every child but the bashes of calls still running.
- When the runner is SIGKILLed, its orphans go up to the host's pool
  process, also a subreaper, which sweeps after every runner exit. That sweep
  is narrowed (`select=`) to processes whose environment carries
  `OMNIGENT_TOOL_OWNER` (set by the shell tool) naming a runner that is no
  longer alive, because the pool's process may have children of its own (the
  local tree's process, a test process with its mock model server).

Where unprivileged user and PID namespaces work, the shell tool runs each
call as PID 1 of a namespace of its own (`shell.namespace_argv`): the kernel
ends everything in it when the call ends or its runner dies, and the sweeps
below have nothing left to do. They are the fallback where namespaces are
not available or are turned off (`OMNIGENT_TOOL_PIDNS=0`).

Residual cases without namespaces, where a process can outlive its owner:
- The host's process itself is SIGKILLed (or is not a subreaper, e.g. a
  kernel without PR_SET_CHILD_SUBREAPER) while a tool has a `setsid`
  grandchild: nothing above is a subreaper, so it goes to init and runs on.
  (The bash and its own group still die through the parent-death signal and
  the group kill.)
- After a runner SIGKILL, an orphan that cleared its environment
  (`env -i setsid cmd &`) is not recognised by the host's sweep.
- A process that changed its uid, or a zombie, cannot be read; zombies are
  left to be reaped by their subreaper's own exit.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable, Collection

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
OWNER_VAR = "OMNIGENT_TOOL_OWNER"
SWEEP_BOUND = 2.0

try:  # loaded here, not in a forked child (die_with_parent runs between fork and exec)
    _libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:
    _libc = None


def _prctl(option: int, arg: int) -> bool:
    if _libc is None:
        return False
    try:
        return _libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0),
                           ctypes.c_ulong(0)) == 0
    except AttributeError:  # a libc without prctl
        return False


def become_subreaper(on: bool = True) -> bool:
    """Make orphaned descendants of this process its children (Linux 3.4+); False where unsupported.

    `on=False` clears the flag again (a process that hosted a pool only for a while).
    """
    return _prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0)


def die_with_parent(parent: int) -> None:
    """For a `preexec_fn`: SIGKILL this (forked) process when its parent dies.

    The kernel ties the signal to the forking *thread*: fork from the trio
    thread itself, never a worker thread (trio's `open_process` uses one, whose
    idle exit would kill the tool). If the parent is already gone, exit now.
    """
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(137)


def children(pid: int | None = None) -> list[int]:
    """The pids whose parent is `pid` (default: this process), from /proc."""
    pid = os.getpid() if pid is None else pid
    found: set[int] = set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.update(int(c) for c in f.read().split())
        return sorted(found)
    except OSError:
        pass
    for name in os.listdir("/proc"):  # kernels without CONFIG_PROC_CHILDREN
        if name.isdigit() and _ppid(int(name)) == pid:
            found.add(int(name))
    return sorted(found)


def _stat(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command's name (state first), None if unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _ppid(pid: int) -> int | None:
    fields = _stat(pid)
    try:
        return None if fields is None else int(fields[1])
    except (IndexError, ValueError):
        return None


def _exiting(pid: int) -> bool:
    """The process is in the middle of its exit: its memory is released, so its environment
    reads as empty, but it is not a zombie yet, so its own children have not been handed on
    (the kernel does that last, in `exit_notify`). Its virtual size (field 23) is 0 then; a
    live process's never is."""
    fields = _stat(pid)
    try:
        return fields is not None and fields[0] not in (b"Z", b"X") and int(fields[20]) == 0
    except (IndexError, ValueError):
        return False


def tool_owner(pid: int) -> int | None:
    """The runner pid in `OMNIGENT_TOOL_OWNER` of that process's environment, None if absent/unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:
        return None
    prefix = OWNER_VAR.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            try:
                return int(entry[len(prefix):])
            except ValueError:
                return None
    return None


def orphaned_tools(alive: Collection[int]) -> Callable[[int], bool]:
    """A `select` for the host's sweep: tool processes whose runner is not in `alive`.

    Tools this very process runs itself are left alone: they are its own calls'.
    """
    me = os.getpid()

    def select(pid: int) -> bool:
        owner = tool_owner(pid)
        return owner is not None and owner not in alive and owner != me
    return select


def _kill(pid: int, keep: Collection[int]) -> None:
    try:
        pgid = os.getpgid(pid)
        if pgid != os.getpgrp() and pgid not in keep:
            os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _reap(pid: int) -> bool:
    try:
        done, _status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True  # reaped already (or never ours to reap)
    return done == pid


def sweep_orphans(keep: Collection[int], *, select: Callable[[int], bool] | None = None) -> list[int]:
    """SIGKILL every child of this process not in `keep` (and its group), and reap exactly those.

    Repeats until a round finds none left and kills none, or 2 s passed:
    killing one orphan hands its own children to us. Never `waitpid(-1)`:
    trio reaps its own children. `select`, if given, narrows which children
    count (see the module docstring); it is asked once per pid. Blocking, but short: a
    SIGKILLed process is gone within milliseconds. Returns the pids swept.
    """
    keep = set(keep)
    swept: list[int] = []
    pending: set[int] = set()
    judged: dict[int, bool] = {}
    deadline = time.monotonic() + SWEEP_BOUND  # not trio code: a plain blocking bound
    while True:
        before = len(swept)
        exiting = False
        for pid in children():
            if pid in keep or pid in pending:
                continue
            if select is not None:
                if pid not in judged:
                    # A dying tool's bash (its runner SIGKILLed: the parent-death signal) reads as
                    # no tool's while it exits, and still holds the `nohup cmd &` it will hand us:
                    # judged then, it would be passed over and the sweep end before the hand-over.
                    if _exiting(pid):
                        exiting = True
                        continue
                    judged[pid] = select(pid)
                if not judged[pid]:
                    continue
            _kill(pid, keep)
            pending.add(pid)
            swept.append(pid)
        pending = {pid for pid in pending if not _reap(pid)}
        if not pending and not exiting and not any(
                pid not in keep and (select is None or judged.get(pid, True)) for pid in children()):
            # Only after a round that killed nothing: /proc/PID/task/TID/children is not reliable
            # while children change (the kernel's own words), and a killed orphan's children are
            # being handed to us just now. One scan missed one in CI (a `cmd &` of a tool left
            # alive).
            if len(swept) == before:
                return swept
        if time.monotonic() >= deadline:
            return swept
        time.sleep(0.005)
