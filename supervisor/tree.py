"""The supervisor: starts children, restarts them by policy, stops them in order.

One `Supervisor.run` owns a nursery with one task per child. Each child task
loops "start, wait for exit, ask the RestartTracker, sleep" and publishes every
transition as an `Event`. Child tasks are shielded from the supervisor's own
cancellation so that shutdown can stop them one by one, in reverse start
order, each with its grace.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import trio

from .events import ChildExited, ChildInfo, Event, GaveUp, Restart
from .policy import RestartPolicy, RestartTracker


@dataclass
class ChildSpec:
    """What to supervise.

    `run` is called as `await nursery.start(run)`: it calls
    `task_status.started(pid_or_None)` once the child is ready, then returns
    when the child ended normally or raises (`ChildExited` or anything else)
    when it ended abnormally. It is cancelled to stop the child.
    """

    name: str
    run: Callable[..., Awaitable[None]]
    restart: Restart = "permanent"
    shutdown_grace: float = 5.0
    policy: RestartPolicy | None = None  # None: the supervisor's


class ChildContext:
    """The link between the supervisor and one start attempt of a child.

    The supervisor makes a fresh one per attempt and puts it in a contextvar
    before calling `ChildSpec.run`, which finds it with `current_child()`.
    A run function registers a killer (how to kill its child *now*, used by
    `Supervisor.kill_child`) and may report the exit status it saw.
    """

    def __init__(self, name: str, shutdown_grace: float) -> None:
        self.name = name
        self.shutdown_grace = shutdown_grace
        self.returncode: int | None = None  # subprocess-style: negative = killed by that signal
        self.kill_reason: str | None = None
        self._killer: Callable[[], None] | None = None
        self._cancel: Callable[[], None] | None = None
        self._finished = False

    def set_killer(self, killer: Callable[[], None]) -> None:
        """Register how to kill this attempt at once (e.g. SIGKILL its process group)."""
        self._killer = killer

    def _kill(self, reason: str) -> None:
        if self._finished:
            return
        if self.kill_reason is None:
            self.kill_reason = reason
        # Without a killer, cancelling the attempt is the strongest kill there is.
        kill = self._killer or self._cancel
        if kill is not None:
            kill()


_current: ContextVar[ChildContext | None] = ContextVar("supervisor_child", default=None)


def current_child() -> ChildContext | None:
    """The `ChildContext` of the attempt this task runs in, or None outside a supervisor."""
    return _current.get()


@dataclass
class _Exit:
    normal: bool
    reason: str
    log_tail: str
    time: float
    healthy_since: float  # when it became running; its exit time if it never did


@dataclass(eq=False)
class _Child:
    spec: ChildSpec
    # Shielded: the supervisor's cancellation must not reach children directly (see module doc).
    scope: trio.CancelScope = field(default_factory=lambda: trio.CancelScope(shield=True))
    settled: trio.Event = field(default_factory=trio.Event)  # first running, or gone
    done: trio.Event = field(default_factory=trio.Event)
    state: str = "starting"
    pid: int | None = None
    restarts: int = 0
    started_at: float | None = None
    ever_running: bool = False
    stopping: bool = False
    ctx: ChildContext | None = None
    last_exit: ChildExited | None = None


def _status(returncode: int | None) -> dict[str, int | None]:
    if returncode is None:
        return {"code": None, "signal": None}
    if returncode < 0:
        return {"code": None, "signal": -returncode}
    return {"code": returncode, "signal": None}


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


class Supervisor:
    """Supervises children by `ChildSpec`; see ARCHITECTURE.md "Supervision semantics"."""

    def __init__(
        self,
        policy: RestartPolicy = RestartPolicy(),
        *,
        name: str = "supervisor",
        rng: random.Random | None = None,
    ) -> None:
        self.policy = policy
        self.name = name
        self._rng = rng or random.Random()
        self._children: dict[str, _Child] = {}  # insertion order = start order
        self._subscribers: list[trio.MemorySendChannel[Event]] = []
        self._nursery: trio.Nursery | None = None
        self._closing = False
        self._finished = False
        self._gave_up: GaveUp | None = None
        self._failed: trio.Event | None = None

    # -- events ---------------------------------------------------------------

    def subscribe(self, max_buffer: int = 1000) -> trio.MemoryReceiveChannel[Event]:
        """A channel that receives every event from now on.

        Sends never block the supervisor: when this channel's buffer is full,
        new events are dropped for this subscriber only. The channel is closed
        when `run` ends, so `async for` over it terminates.
        """
        send, receive = trio.open_memory_channel[Event](max_buffer)
        if self._finished:
            send.close()
        else:
            self._subscribers.append(send)
        return receive

    def _emit(self, kind: str, child: _Child, **fields: Any) -> None:
        event = Event(kind, child.spec.name, trio.current_time(), **fields)
        for send in list(self._subscribers):
            try:
                send.send_nowait(event)
            except trio.WouldBlock:
                pass  # a slow subscriber loses events rather than stalling supervision
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._subscribers.remove(send)

    # -- public control -------------------------------------------------------

    async def run(
        self,
        specs: Sequence[ChildSpec] = (),
        *,
        task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Start `specs` in order, report started once all are running, supervise.

        Only ends by cancellation (children stopped in reverse start order) or
        by raising `GaveUp` after a child exceeded its restart intensity (the
        other children are stopped first).
        """
        if self._nursery is not None or self._finished:
            raise RuntimeError("Supervisor.run can only be called once")
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"child names must be unique: {names}")
        self._failed = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    for spec in specs:
                        await self._start(spec)
                        if self._failed.is_set():
                            break
                    else:
                        task_status.started(self)
                        await self._failed.wait()
                finally:
                    self._closing = True
                    with trio.CancelScope(shield=True):
                        await self._stop_all()
        finally:
            self._finished = True
            for send in self._subscribers:
                send.close()
            self._subscribers.clear()
        assert self._gave_up is not None
        raise self._gave_up

    async def start_child(self, spec: ChildSpec) -> None:
        """Add a child while running; return once it is running.

        Its first start goes through the restart policy like any other. If it
        never gets running: `GaveUp` when it exhausted its intensity (run fails
        too), else `ChildExited` (a temporary/transient child that ended, or a
        child stopped before it was ready).
        """
        child = await self._start(spec)
        if child.ever_running:
            return
        gave_up = self._gave_up
        if gave_up is not None and gave_up.child == spec.name:
            raise GaveUp(gave_up.child, gave_up.reason, gave_up.log_tail)
        last = child.last_exit
        if last is None:
            raise ChildExited("stopped before it was running")
        raise ChildExited(last.reason, code=last.code, signal=last.signal, log_tail=last.log_tail)

    async def stop_child(self, name: str) -> None:
        """Stop a child for good (no restart); return when it is stopped. Unknown name: no-op."""
        child = self._children.get(name)
        if child is not None:
            await self._stop(child)

    def kill_child(self, name: str, reason: str) -> None:
        """Kill a child's current attempt now, as an abnormal exit with `reason`.

        Uses the killer its run function registered (process children SIGKILL
        their process group), else cancels the attempt. The restart policy then
        applies as for any crash. No-op if the child is not running or starting.
        """
        child = self._children.get(name)
        if child is not None and child.ctx is not None and not child.stopping:
            child.ctx._kill(reason)

    def children(self) -> dict[str, ChildInfo]:
        """A snapshot of the live children (gone-for-good ones are removed)."""
        return {
            name: ChildInfo(name, c.state, c.pid, c.restarts, c.started_at)
            for name, c in self._children.items()
        }

    # -- internals ------------------------------------------------------------

    async def _start(self, spec: ChildSpec) -> _Child:
        if self._nursery is None or self._closing:
            raise RuntimeError(f"{self.name} is not running")
        if spec.name in self._children:
            raise ValueError(f"{self.name} already has a child named {spec.name!r}")
        child = _Child(spec)
        self._children[spec.name] = child
        self._nursery.start_soon(self._child_loop, child, name=f"{self.name}/{spec.name}")
        await self._settled_or_failed(child)
        return child

    async def _settled_or_failed(self, child: _Child) -> None:
        """Wait until `child` is running or gone, or until another child gave up.

        A give-up stops the whole supervisor at once: waiting on for a slow
        starter would keep restarting it after the give-up, and delay the
        GaveUp (and what the parent does with it) by as long as it takes.
        """
        failed = self._failed
        if failed is None:
            await child.settled.wait()
            return
        async with trio.open_nursery() as race:
            async def first(event: trio.Event) -> None:
                await event.wait()
                race.cancel_scope.cancel()

            race.start_soon(first, child.settled)
            race.start_soon(first, failed)

    async def _stop(self, child: _Child) -> None:
        if not child.stopping and not child.done.is_set():
            child.stopping = True
            child.state = "stopping"
            self._emit("stopping", child, pid=child.pid)
            child.scope.cancel()
        await child.done.wait()

    async def _stop_all(self) -> None:
        while self._children:
            await self._stop(list(self._children.values())[-1])

    async def _child_loop(self, child: _Child) -> None:
        spec = child.spec
        tracker = RestartTracker(spec.policy or self.policy, self._rng)
        try:
            with child.scope:
                while True:
                    exit = await self._attempt(child)
                    if child.stopping:
                        break
                    if spec.restart == "temporary" or (spec.restart == "transient" and exit.normal):
                        break
                    delay = tracker.on_exit(exit.healthy_since, exit.time)
                    if delay is None:
                        self._give_up(child, exit)
                        break
                    child.state, child.pid, child.ctx = "restarting", None, None
                    child.restarts += 1
                    self._emit("restarting", child, delay=delay, reason=exit.reason)
                    await trio.sleep(delay)
        finally:
            if self._children.get(spec.name) is child:
                del self._children[spec.name]
            if child.stopping:
                rc = child.ctx.returncode if child.ctx is not None else None
                self._emit("stopped", child, pid=child.pid, **_status(rc))
            child.done.set()
            child.settled.set()

    async def _attempt(self, child: _Child) -> _Exit:
        """One start of the child, from "starting" to "exited"."""
        spec = child.spec
        ctx = ChildContext(spec.name, spec.shutdown_grace)
        child.state, child.pid, child.started_at = "starting", None, trio.current_time()
        self._emit("starting", child)
        running_at: float | None = None
        error: BaseException | None = None
        token = _current.set(ctx)  # the run task copies this context when it is spawned
        try:
            async with trio.open_nursery() as attempt:
                ctx._cancel = attempt.cancel_scope.cancel
                child.ctx = ctx
                pid = await attempt.start(spec.run)
                running_at = trio.current_time()
                child.state, child.pid = "running", pid
                self._emit("running", child, pid=pid)
                child.ever_running = True
                child.settled.set()
        except* Exception as group:
            error = _first_leaf(group)
        finally:
            ctx._finished = True
            _current.reset(token)

        now = trio.current_time()
        status = _status(ctx.returncode)
        log_tail = ""
        if isinstance(error, ChildExited):
            status = {"code": error.code, "signal": error.signal}
            log_tail = error.log_tail
        if ctx.kill_reason is not None:
            normal, reason = False, ctx.kill_reason
        elif isinstance(error, ChildExited):
            normal, reason = False, error.reason
        elif error is not None:
            normal, reason = False, f"crashed: {type(error).__name__}: {error}"
        else:
            normal, reason = True, "exited normally"
        if not normal:
            child.last_exit = ChildExited(reason, log_tail=log_tail, **status)
        self._emit("exited", child, pid=child.pid, reason=reason, **status)
        healthy_since = running_at if running_at is not None else now
        return _Exit(normal, reason, log_tail, now, healthy_since)

    def _give_up(self, child: _Child, exit: _Exit) -> None:
        self._emit("gave_up", child, reason=exit.reason)
        if self._gave_up is None:
            self._gave_up = GaveUp(child.spec.name, exit.reason, exit.log_tail)
        assert self._failed is not None
        self._failed.set()

