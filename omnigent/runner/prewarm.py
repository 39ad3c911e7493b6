"""The runner's heavy imports, paid while it dials, and the steps that need them.

openai (via `harness`, ~0.3-0.5 s, seconds under load) is imported and the
first client built in a worker thread that starts before anything else,
while stdin and signals are already watched (a runner whose parent dies
mid-import still exits at once: the thread is abandoned). The dial (TCP,
the websocket upgrade, waiting for a server still starting) overlaps that
import; the hello waits for it (`connection.py`). A step that arrives before
the import is done anyway waits for it (`_load_harness`); a model step then
goes to the harness, a tool step to `tool_steps.py`.

Tools: the tools package is imported first, and the runner makes itself a
child subreaper (`PR_SET_CHILD_SUBREAPER`) before the first tool can run, so
a tool's daemonised grandchildren (`cmd &`, `nohup`, a double fork) are
reparented to it rather than to init, and it sweeps them (`sweep_orphans`)
whenever no tool runs and once more at exit.
"""

from __future__ import annotations

from types import ModuleType

import trio

from protocol import Frame, ToolStart

from ..config import collector
from ..config.timeline import mark, watch_gc
from ._log import log, one_line
from .state import RunnerState
from .tool_steps import cancelled_result
from .turns import Emit, Start


class PrewarmMixin(RunnerState):
    """The harness and the tools, imported off the loop, and the steps run with them."""

    def _import_harness(self) -> None:
        # In a worker thread: the loop keeps watching stdin and signals meanwhile.
        self._import_tools()
        from omnigent.runner import harness

        pool = harness.ClientPool()
        try:
            harness.prewarm(pool, self.environ)
        except Exception as exc:  # only an optimisation; the turn will report a real problem
            log(f"prewarm failed: {one_line(exc)}")
        self._harness, self._pool = harness, pool

    def _import_tools(self) -> None:
        # Before the first tool can run: its orphans must come to us, not to init.
        if self._secrets is not None:
            return
        try:
            from omnigent.tools import reaper, secret_values
        except ImportError as exc:  # the turn reports it when a tool is asked for
            log(f"tools unavailable: {one_line(exc)}")
            return
        if not reaper.become_subreaper():
            log("could not become a child subreaper: a tool's daemonised processes are not swept here")
        self._secrets = secret_values(self.environ)

    async def prewarm(self) -> None:
        """Pay the import and the first client's cost while dialing, not inside the first turn."""
        self._prewarming = True
        try:
            with self._prewarm_scope:  # stopping abandons the thread: os._exit ends it with us
                await trio.to_thread.run_sync(self._import_harness, abandon_on_cancel=True)
        finally:
            self._prewarmed.set()
        collector.tune()  # the SDK and the harness are loaded: they live as long as the runner
        watch_gc("runner_")  # (only with $OMNIGENT_STALLS: a benchmark's p99 names a runner's pauses too)
        mark("runner.prewarmed")

    async def _load_harness(self) -> ModuleType:
        if self._harness is None and self._prewarming:
            await self._prewarmed.wait()
        if self._harness is None:  # prewarm failed to import it: the turn says why
            await trio.to_thread.run_sync(self._import_harness)
        assert self._harness is not None
        return self._harness

    # --- turns (turns.py) ----------------------------------------------

    async def _execute(self, start: Start, emit: Emit, captured: list[str]) -> Frame:
        if isinstance(start, ToolStart):
            from . import tool_steps

            if self._secrets is None and self._prewarming:
                await self._prewarmed.wait()  # it imports the tools first
            if self._secrets is None:
                await trio.to_thread.run_sync(self._import_tools)
            return await tool_steps.run_tool_step(start, emit, captured, self._tools, self.environ)
        harness = await self._load_harness()
        return await harness.execute(self._pool, start, emit, self.environ)

    def _cancelled_tool(self, start: ToolStart, captured: list[str]) -> Frame:
        secrets = self._secrets or []
        if self._secrets is not None:  # as run_tool_step does: an early runner's environment grew since
            from omnigent.tools import secret_values

            secrets = secret_values(self.environ)
        return cancelled_result(start, captured, secrets)
