"""One tool step of a turn, on the runner: the host's policy, the run, its streamed output.

The server decides whether a call may run (approvals live there) and says why
in `ToolStart.approval`; this module enforces the host's own bound on top
(`OMNIGENT_TOOL_POLICY`, set by `omnigent host --permissions`): a bundle
uploaded by a client can never make a host run a side-effecting tool that the
host's owner did not allow. Then it runs the call with `omnigent.tools.run_tool`
in a scrubbed environment, relays what the tool prints as batched
`session.tool.output` events, and answers one `ToolResult`.

What it guarantees:
- a side-effecting call with approval "auto" on a host that is not auto, or
  any side-effecting call on a deny host, is refused, never run;
- the tool's environment holds no credential (`scrub_env`), and known secret
  values never reach the output;
- a cancelled call (Ctrl-C) answers "cancelled" with the output so far (the
  tools package has killed its process group by then);
- a preview (`approval == "preview"`) always answers status "preview", an
  empty diff when it cannot say (cancelled, no workspace, a crash): the
  server tells it from the same step's real result by that status;
- at most one output event per 100 ms or per 16 KiB, and all of them before
  the result, in order;
- orphans are swept once no tool runs any more (`ToolSlots`), never while a
  tool is starting or running, whose processes would be swept with them.

The tools package is imported lazily: a runner that is never sent a tool
step does not pay for it.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping, Sequence

import trio

from protocol import Frame, ToolResult, ToolStart, TurnEvent
from protocol import events as ev

from ._log import log, one_line

Emit = Callable[[Frame], Awaitable[None]]

POLICY_ENV = "OMNIGENT_TOOL_POLICY"
POLICIES = ("deny", "ask", "auto")
APPROVALS = ("read_only", "auto", "user", "preview")

FLUSH_INTERVAL = 0.1        # at most one output event per this many seconds...
FLUSH_BYTES = 16 * 1024     # ...unless this much is waiting
CANCELLED_KEEP = 64 * 1024  # output so far told to the model after a cancel: head + tail
NO_WORKSPACE = "this session has no workspace, so file and shell tools are not available"


def host_policy(environ: Mapping[str, str]) -> str:
    """The host's bound on its tools: ask | auto | deny (unset: ask)."""
    raw = (environ.get(POLICY_ENV) or "ask").strip().lower()
    if raw not in POLICIES:
        log(f"{POLICY_ENV}={raw!r} is not one of {', '.join(POLICIES)}: side-effecting tools are refused")
        return "deny"
    return raw


def refusal(start: ToolStart, policy: str) -> str | None:
    """Why the host refuses this call (one line), or None when it may run."""
    from omnigent.tools.policy import SIDE_EFFECTING  # at the first tool step, not at start-up

    if start.approval not in APPROVALS:
        return f"not run: unknown approval {start.approval!r}"
    if start.approval == "preview" or start.name not in SIDE_EFFECTING:
        return None
    if policy == "deny":
        return f"not run: this host does not run side-effecting tools ({POLICY_ENV}=deny)"
    if start.approval == "read_only":
        return f"not run: {start.name} has side effects and was not approved"
    if start.approval == "auto" and policy != "auto":
        return (f"not run: this host runs side-effecting tools only when a person approves them "
                f"({POLICY_ENV}={policy})")
    return None


def cancelled_result(start: ToolStart, captured: Sequence[str], secrets: Sequence[str] = ()) -> ToolResult:
    """The end of a call cancelled mid-run: what it had printed, so the model knows what happened."""
    if start.approval == "preview":
        return _no_diff(start)
    text = _keep("".join(captured))
    if secrets:
        from omnigent.tools import redact

        text = redact(text, secrets)
    return ToolResult(start.turn_id, start.call_id, "cancelled", f"cancelled by the user. Output so far:\n{text}")


def crashed_result(start: ToolStart, exc: BaseException) -> ToolResult:
    if start.approval == "preview":
        return _no_diff(start)
    return ToolResult(start.turn_id, start.call_id, "error",
                      one_line(f"the runner failed running {start.name}: {type(exc).__name__}: {exc}"))


class ToolSlots:
    """Counts the tools running on this runner, and sweeps orphans when none is.

    `sweep_orphans` kills every child of the runner not listed; while a tool
    runs, its own processes are such children, so the sweep waits until the
    last running tool ended, and a tool that wants to start meanwhile waits
    for the sweep to finish (a few ms; at most its 2 s bound)."""

    def __init__(self, sweep: Callable[[], list[int]] | None = None) -> None:
        self._running = 0
        self._sweeping: trio.Event | None = None
        self._sweep = sweep or _sweep_orphans

    @property
    def running(self) -> int:
        return self._running

    async def enter(self) -> None:
        while self._sweeping is not None:
            await self._sweeping.wait()
        self._running += 1

    async def exit(self) -> None:
        self._running -= 1
        if self._running == 0 and self._sweeping is None:
            await self.sweep()

    async def sweep(self) -> None:
        done = self._sweeping = trio.Event()
        try:
            with trio.CancelScope(shield=True):  # a cancelled tool still leaves nothing behind
                swept = await trio.to_thread.run_sync(self._sweep)
            if swept:
                log(f"swept {len(swept)} orphaned tool process(es): {', '.join(map(str, swept))}")
        except Exception as exc:  # a failed sweep must not fail the turn; the host sweeps again
            log(f"sweeping orphaned tool processes failed: {one_line(exc)}")
        finally:
            self._sweeping = None
            done.set()


def _sweep_orphans() -> list[int]:
    from omnigent.tools import running_tool_pids
    from omnigent.tools.reaper import sweep_orphans

    # Empty whenever this runs (ToolSlots), and no tool starts meanwhile; kept as the guard it is.
    return sweep_orphans(keep=running_tool_pids())


class _Output:
    """Batches a tool's output into `session.tool.output` events (one per 100 ms or 16 KiB)."""

    def __init__(self, start: ToolStart, emit: Emit) -> None:
        self._start, self._emit = start, emit
        self._parts: list[str] = []
        self._size = 0
        self._wake = trio.Event()
        self._lock = trio.Lock()  # the flusher and a 16 KiB flush never interleave their sends

    async def add(self, chunk: str) -> None:
        if not chunk:
            return
        self._parts.append(chunk)
        self._size += len(chunk)
        if self._size >= FLUSH_BYTES:
            await self.flush()
        else:
            self._wake.set()

    async def flush(self) -> None:
        async with self._lock:
            if not self._parts:
                return
            delta, self._parts, self._size = "".join(self._parts), [], 0
            await self._emit(TurnEvent(self._start.turn_id, ev.make_event(
                ev.TOOL_OUTPUT, turn_id=self._start.turn_id, call_id=self._start.call_id, delta=delta)))

    async def flusher(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            await trio.sleep(FLUSH_INTERVAL)
            await self.flush()


async def run_tool_step(
    start: ToolStart, emit: Emit, captured: list[str], slots: ToolSlots,
    environ: Mapping[str, str] = os.environ,
) -> ToolResult:
    """Run one ToolStart and return its ToolResult (a cancel is the caller's: see `cancelled_result`).

    `captured` is filled with every chunk of output as it comes, so the
    caller can tell the model what ran before a cancel."""
    if start.workspace is None:
        if start.approval == "preview":
            return _no_diff(start)
        return ToolResult(start.turn_id, start.call_id, "error", NO_WORKSPACE)
    why = refusal(start, host_policy(environ))
    if why is not None:
        log(f"turn {start.turn_id} step {start.step}: {start.name} refused: {why}")
        return ToolResult(start.turn_id, start.call_id, "refused", why)
    import omnigent.tools as tools

    if start.approval == "preview":
        return ToolResult(start.turn_id, start.call_id, "preview", await tools.preview(
            start.name, start.arguments, start.workspace, secrets=tools.secret_values(environ)))
    output = _Output(start, emit)
    ctx = tools.ToolContext(workspace=start.workspace, timeout_s=start.timeout_s, env=tools.scrub_env(environ),
                            secrets=tools.secret_values(environ), on_output=output.add, captured=captured)
    failure: Exception | None = None
    await slots.enter()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(output.flusher)
            try:
                outcome = await tools.run_tool(start.name, start.arguments, ctx)
            except Exception as exc:  # raised as itself below, not inside the nursery's group
                failure = exc
            finally:
                with trio.CancelScope(shield=True):  # what was printed goes out before the result
                    with trio.move_on_after(1):
                        await output.flush()
            nursery.cancel_scope.cancel()
    finally:
        await slots.exit()
    if failure is not None:
        raise failure
    return ToolResult(start.turn_id, start.call_id, outcome.status, outcome.output, outcome.exit_code)


def _no_diff(start: ToolStart) -> ToolResult:
    # a preview always answers as a preview: the server tells it from the call's real result by status
    return ToolResult(start.turn_id, start.call_id, "preview", "")


def _keep(text: str) -> str:
    if len(text) <= CANCELLED_KEEP:
        return text
    half = CANCELLED_KEEP // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} bytes cut ...]\n{text[-half:]}"


__all__ = ["ToolSlots", "cancelled_result", "crashed_result", "host_policy", "refusal", "run_tool_step"]
