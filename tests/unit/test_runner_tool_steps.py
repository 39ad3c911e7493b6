"""Tool steps on the runner (omnigent/runner/{tool_steps,turns,main}.py), on a MockClock.

Why: the runner is where the host's own policy is enforced (a client must
never raise its own mode on someone else's host), where a cancelled tool
tells the model what it had printed, and where one step of a turn must run
once however often the server sends it. The runner runs against the fake
websocket of the reconnect tests; `omnigent.tools.run_tool` is replaced by a
script, so nothing here starts a process.
"""

from __future__ import annotations

import json
import random
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

import omnigent.tools as tools
import protocol as p
from omnigent.runner import tool_steps
from omnigent.runner.main import Config, Runner
from omnigent.runner.tool_steps import FLUSH_BYTES, ToolSlots, refusal

from .test_runner_reconnect import FakeModel, FakeServer

SECRET = "sk-very-secret-value-123"


def tool_start(name: str = "shell", approval: str = "user", *, step: int = 1, attempt: int = 1,
               call_id: str = "call_1", workspace: str | None = "/w", arguments: str | None = None) -> p.ToolStart:
    return p.ToolStart(turn_id="turn_1", session_id="conv_1", attempt=attempt, step=step, call_id=call_id, name=name,
                       arguments=arguments or json.dumps({"command": "echo hi"}), approval=approval, timeout_s=30.0,
                       workspace=workspace, generation=2)


class FakeTools:
    """Stands in for `omnigent.tools.run_tool`: prints the scripted chunks, then waits for `release`."""

    def __init__(self, chunks: tuple[str, ...] = ("hello\n",), *, gap: float = 0.0) -> None:
        self.chunks, self.gap = chunks, gap
        self.calls: list[tuple[str, str, Any]] = []
        self.release = trio.Event()
        self.running = 0

    async def run_tool(self, name: str, arguments: str, ctx: tools.ToolContext) -> tools.ToolOutcome:
        self.calls.append((name, arguments, ctx))
        self.running += 1
        try:
            for chunk in self.chunks:
                chunk = tools.redact(chunk, ctx.secrets)
                ctx.captured.append(chunk)
                await ctx.on_output(chunk)
                await trio.sleep(self.gap)
            await self.release.wait()
        finally:
            self.running -= 1
        return tools.ToolOutcome("completed", "".join(ctx.captured) + "exit code: 0", 0)

    async def preview(self, name: str, arguments: str, workspace: str, *, secrets: Any = None) -> str:
        assert SECRET in secrets
        self.calls.append((name, arguments, workspace))
        return "--- a\n+++ b\n"


@pytest.fixture
def fake_tools(monkeypatch) -> FakeTools:
    fake = FakeTools()
    monkeypatch.setattr(tools, "run_tool", fake.run_tool)
    monkeypatch.setattr(tools, "preview", fake.preview)
    return fake


class Harness:
    """A runner online on a fake connection, with its sweeps counted."""

    def __init__(self, environ: dict[str, str]) -> None:
        self.server, self.model = FakeServer(), FakeModel()
        self.runner = Runner(Config("http://server", "runner_a", "secret"), environ, dial=self.server.dial,
                             rng=random.Random(3))
        self.runner._harness = SimpleNamespace(execute=self.model.execute)  # type: ignore[assignment]
        self.runner._secrets = [SECRET]  # as if the tools were loaded (no prctl on the test process)
        self.sweeps: list[int] = []
        self.runner._tools = ToolSlots(sweep=self._sweep)
        self.ws: Any = None

    def _sweep(self) -> list[int]:
        self.sweeps.append(self.runner._tools.running)
        return []

    async def until(self, kind: type, turn_id: str = "turn_1") -> tuple[Any, list[p.Frame]]:
        seen = []
        while True:
            frame = await self.ws.recv()
            seen.append(frame)
            if isinstance(frame, kind) and getattr(frame, "turn_id", None) == turn_id:
                return frame, seen


@pytest.fixture
async def online(autojump_clock, nursery):
    async def start(environ: dict[str, str] | None = None) -> Harness:
        h = Harness({"OMNIGENT_TOOL_POLICY": "ask", "OPENAI_API_KEY": SECRET, **(environ or {})})
        nursery.start_soon(h.runner.connect_and_serve)
        h.ws = await h.server.accept()
        await h.ws.handshake()
        return h

    return start


def outputs(frames: list[p.Frame]) -> list[str]:
    return [f.event["delta"] for f in frames
            if isinstance(f, p.TurnEvent) and f.event["type"] == "session.tool.output"]


# --- the host's policy --------------------------------------------------------


@pytest.mark.parametrize(("name", "approval", "policy_", "runs"), [
    ("read_file", "read_only", "deny", True),
    ("grep", "read_only", "ask", True),
    ("shell", "user", "ask", True),
    ("shell", "user", "auto", True),
    ("shell", "auto", "auto", True),
    ("shell", "auto", "ask", False),     # a client's "auto" on a host that only runs what a person approved
    ("write_file", "user", "deny", False),
    ("edit_file", "auto", "deny", False),
    ("shell", "read_only", "auto", False),  # a side-effecting tool is never read-only
    ("shell", "whatever", "auto", False),
    ("write_file", "preview", "deny", True),  # a preview changes nothing
])
def test_the_hosts_policy(name, approval, policy_, runs):
    why = refusal(tool_start(name, approval), policy_)
    assert (why is None) == runs, why
    assert why is None or (why.startswith("not run: ") and "\n" not in why)


def test_an_unknown_host_policy_is_deny():
    assert tool_steps.host_policy({"OMNIGENT_TOOL_POLICY": "yolo"}) == "deny"
    assert tool_steps.host_policy({}) == "ask"
    assert tool_steps.host_policy({"OMNIGENT_TOOL_POLICY": " AUTO "}) == "auto"


async def test_a_refused_call_is_never_run(online, fake_tools):
    h = await online({"OMNIGENT_TOOL_POLICY": "ask"})
    h.ws.send(tool_start("shell", "auto"))
    result, _ = await h.until(p.ToolResult)
    assert result.status == "refused" and "OMNIGENT_TOOL_POLICY=ask" in result.output
    assert fake_tools.calls == []


async def test_no_workspace_is_an_error_to_the_model(online, fake_tools):
    h = await online()
    h.ws.send(tool_start("read_file", "read_only", workspace=None))
    result, _ = await h.until(p.ToolResult)
    assert (result.status, result.output) == ("error", tool_steps.NO_WORKSPACE)
    assert fake_tools.calls == []


# --- running -------------------------------------------------------------------


async def test_a_call_runs_in_a_scrubbed_environment_and_streams_its_output(online, fake_tools):
    fake_tools.chunks = ("one\n", f"key {SECRET}\n")
    fake_tools.release.set()
    h = await online({"MY_TOKEN": "tok-abcdefgh12345", "LANG": "C.UTF-8"})
    h.ws.send(tool_start())
    result, frames = await h.until(p.ToolResult)
    assert result == p.ToolResult("turn_1", "call_1", "completed", "one\nkey [redacted]\nexit code: 0", 0)
    [(name, arguments, ctx)] = fake_tools.calls
    assert (name, arguments, ctx.workspace, ctx.timeout_s) == ("shell", '{"command": "echo hi"}', "/w", 30.0)
    assert ctx.env.get("LANG") == "C.UTF-8"
    assert not {"MY_TOKEN", "OPENAI_API_KEY"} & set(ctx.env)
    assert SECRET in ctx.secrets and "tok-abcdefgh12345" in ctx.secrets
    assert "".join(outputs(frames)) == "one\nkey [redacted]\n"
    assert all(f.event["call_id"] == "call_1" for f in frames if isinstance(f, p.TurnEvent))
    assert h.sweeps == [0]  # swept after the tool, with no tool running


async def test_output_is_batched_per_100_ms_or_16_kib(online, fake_tools):
    fake_tools.chunks = tuple(f"{n}\n" for n in range(10))  # all within one flush interval
    fake_tools.release.set()
    h = await online()
    h.ws.send(tool_start())
    _, frames = await h.until(p.ToolResult)
    assert outputs(frames) == ["".join(f"{n}\n" for n in range(10))]

    fake_tools.chunks = ("x" * FLUSH_BYTES, "y")
    h.ws.send(tool_start(step=3, call_id="call_3"))
    _, frames = await h.until(p.ToolResult)
    assert outputs(frames) == ["x" * FLUSH_BYTES, "y"]  # the big one at once, the rest on the timer

    fake_tools.chunks, fake_tools.gap = ("a", "b", "c"), 0.15
    h.ws.send(tool_start(step=5, call_id="call_5"))
    _, frames = await h.until(p.ToolResult)
    assert outputs(frames) == ["a", "b", "c"]


async def test_cancel_answers_cancelled_with_the_output_so_far(online, fake_tools):
    fake_tools.chunks = ("compiling\n", f"using {SECRET}\n")
    h = await online()
    h.ws.send(tool_start())
    while fake_tools.running == 0 or len(fake_tools.calls[0][2].captured) < 2:
        await trio.sleep(0.01)
    h.ws.send(p.Cancel("turn_1"))
    result, _ = await h.until(p.ToolResult)
    assert result == p.ToolResult("turn_1", "call_1", "cancelled",
                                  "cancelled by the user. Output so far:\ncompiling\nusing [redacted]\n")
    assert h.sweeps == [0]


async def test_a_crash_is_the_calls_error_not_the_runners(online, monkeypatch):
    async def broken(name: str, arguments: str, ctx: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(tools, "run_tool", broken)
    h = await online()
    h.ws.send(tool_start())
    result, _ = await h.until(p.ToolResult)
    assert result.status == "error" and "RuntimeError: boom" in result.output and h.sweeps == [0]


async def test_preview_answers_the_diff_and_runs_nothing(online, fake_tools):
    h = await online({"OMNIGENT_TOOL_POLICY": "deny"})
    h.ws.send(tool_start("write_file", "preview", arguments='{"path": "a", "content": "b"}'))
    result, _ = await h.until(p.ToolResult)
    assert (result.status, result.output) == ("preview", "--- a\n+++ b\n")
    assert fake_tools.calls == [("write_file", '{"path": "a", "content": "b"}', "/w")]
    h.ws.send(tool_start("write_file", "preview", step=2, workspace=None))
    result, _ = await h.until(p.ToolResult)
    assert (result.status, result.output) == ("preview", "")  # never an error: it is still a preview


async def test_a_preview_and_the_call_it_previews_are_two_steps_of_one_number(online, fake_tools):
    # the server asks for the diff, then (approved) runs the same step: the second is not a duplicate
    fake_tools.release.set()
    h = await online()
    h.ws.send(tool_start("write_file", "preview", step=4, arguments='{"path": "a", "content": "b"}'))
    h.ws.send(tool_start("write_file", "user", step=4, arguments='{"path": "a", "content": "b"}'))
    first, _ = await h.until(p.ToolResult)
    second, _ = await h.until(p.ToolResult)
    assert (first.status, second.status) == ("preview", "completed")
    assert [c[0] for c in fake_tools.calls] == ["write_file", "write_file"]
    assert fake_tools.calls[0][2] == "/w" and isinstance(fake_tools.calls[1][2], tools.ToolContext)


# --- one step at a time, once --------------------------------------------------


async def test_a_step_sent_twice_runs_once_and_claims_name_the_step(online, fake_tools):
    h = await online()
    h.ws.send(tool_start(step=2))
    h.ws.send(tool_start(step=2))  # e.g. the server re-sent it after adopting the turn
    while fake_tools.running == 0:
        await trio.sleep(0.01)
    await trio.testing.wait_all_tasks_blocked()
    assert len(fake_tools.calls) == 1
    assert h.runner._turns.claims() == [{"turn_id": "turn_1", "attempt": 1, "generation": 2, "step": 2,
                                         "kind": "tool", "call_id": "call_1"}]
    fake_tools.release.set()
    result, _ = await h.until(p.ToolResult)
    assert result.status == "completed" and len(fake_tools.calls) == 1
    await trio.testing.wait_all_tasks_blocked()
    assert h.runner._turns.claims() == []


async def test_the_next_step_of_a_turn_runs_after_the_last_ended(online, fake_tools):
    fake_tools.release.set()
    h = await online()
    h.ws.send(tool_start(step=1))
    first, _ = await h.until(p.ToolResult)
    h.ws.send(tool_start(step=2, call_id="call_2"))
    second, _ = await h.until(p.ToolResult)
    assert (first.call_id, second.call_id) == ("call_1", "call_2") and len(fake_tools.calls) == 2


async def test_no_sweep_while_another_tool_runs(online, fake_tools, monkeypatch):
    h = await online()
    h.ws.send(tool_start())
    other = p.ToolStart(**{**tool_start().__dict__, "turn_id": "turn_2", "session_id": "conv_2"})
    h.ws.send(other)
    while fake_tools.running < 2:
        await trio.sleep(0.01)
    h.ws.send(p.Cancel("turn_1"))
    await h.until(p.ToolResult, "turn_1")
    assert h.sweeps == []  # turn_2's tool still runs: its processes are the runner's children
    fake_tools.release.set()
    await h.until(p.ToolResult, "turn_2")
    assert h.sweeps == [0]


async def test_pings_are_answered_while_a_tool_runs(online, fake_tools):
    h = await online()
    h.ws.send(tool_start())
    while fake_tools.running == 0:
        await trio.sleep(0.01)
    h.ws.send(p.Ping(ts=4.5))
    pong, _ = await h.until(p.Pong, turn_id=None)  # type: ignore[arg-type]
    assert pong == p.Pong(4.5)
    fake_tools.release.set()
    await h.until(p.ToolResult)
