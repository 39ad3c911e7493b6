"""Integration tests of the REPL inside the real tree of `omnigent run`.

Why: the REPL's contract is with a live server (HTTP + websocket), a real
runner process and the mock LLM; only its input (scripted lines) and its
screen (a recording stream) are stand-ins. `run_tree` is the same function
`omnigent run` uses, so the server, host and runner are the production ones.
Real clock, every wait bounded.
"""

from __future__ import annotations

import io
import logging
import math
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio

from omnigent.agents import bundle_from_spec, load_spec
from omnigent.client import OmnigentClient
from omnigent.tree.local import run_tree
from omnigent.repl.options import FrontOptions
from omnigent.repl.repl import Repl
from omnigent.store import Store
from tests.conftest import configure_mock_llm, mock_requests

WAIT = 20


class ScriptedLines:
    """Lines the test feeds one by one; None is Ctrl-D. Shows `❯ ` while waiting."""

    def __init__(self, *lines: str | None, interactive: bool = True) -> None:
        self.interactive = interactive
        self._in, self._out = trio.open_memory_channel[str | None](math.inf)
        self.reading = trio.Event()
        for line in lines:
            self.feed(line)

    def feed(self, line: str | None) -> None:
        self._in.send_nowait(line)

    async def read(self, prompt: str, *, remember: bool = True) -> str:
        self.reading.set()
        try:
            line = await self._out.receive()
        finally:
            self.reading = trio.Event()
        if line is None:
            raise EOFError
        return line

    def shown_prompt(self) -> str | None:
        return "❯ " if self.reading.is_set() else None


class Screen(io.StringIO):
    """stdout and stderr of the REPL, in order, with a way to wait for text."""

    def __init__(self) -> None:
        super().__init__()
        self._changed = trio.Event()

    def write(self, text: str) -> int:
        n = super().write(text)
        self._changed.set()
        self._changed = trio.Event()
        return n

    async def wait_for(self, text: str, count: int = 1) -> None:
        with trio.fail_after(WAIT):
            while self.getvalue().count(text) < count:
                await self._changed.wait()


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mock_llm_server_url: str):
    """Runs a front end in a fresh `omnigent run` tree; yields (run, options, model key)."""
    model = f"mock-repl-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("OPENAI_BASE_URL", f"{mock_llm_server_url}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "mock-key")
    monkeypatch.delenv("OMNIGENT_SESSIONS_ADAPTER_DEBUG", raising=False)
    yaml_path = tmp_path / "agent.yaml"
    yaml_path.write_text(f"name: repl_it\nprompt: Be brief.\nexecutor:\n  model: {model}\n")
    spec = load_spec(yaml_path)
    options = FrontOptions(agent_path=str(yaml_path), agent_name=spec.name, bundle=bundle_from_spec(spec),
                           workspace=str(tmp_path))
    db_path = tmp_path / "chat.db"
    handlers = list(logging.getLogger().handlers)

    async def run(front: Callable[[OmnigentClient], Awaitable[int]]) -> int:
        return await run_tree(db_path, lambda: front)

    yield run, options, model, db_path
    assert logging.getLogger().handlers == handlers  # run_tree closed the log file it opened


def _repl(client: OmnigentClient, options: FrontOptions, session_id: str | None,
          lines: ScriptedLines) -> tuple[Repl, Screen]:
    repl = Repl(client, options, session_id, lines)
    screen = Screen()
    repl.console.out = repl.console.err = screen
    return repl, screen


async def test_late_output_is_printed_above_the_prompt_which_is_drawn_again(tree, mock_llm_server_url):
    run, options, model, _ = tree
    configure_mock_llm(mock_llm_server_url, [{"text": "FIRST"}, {"text": "LATE ANSWER"}], key=model)
    lines = ScriptedLines("hello")

    async def front(client: OmnigentClient) -> int:
        repl, screen = _repl(client, options, None, lines)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(repl.run)
            await screen.wait_for("FIRST")
            with trio.fail_after(WAIT):
                await lines.reading.wait()
            # another client's turn on the same conversation, while the REPL sits at its prompt
            await client.post_message(repl.session_id, "from elsewhere")
            await screen.wait_for("LATE ANSWER\n❯ ")
            lines.feed(None)
        assert "\r\x1b[KLATE ANSWER\n❯ " in screen.getvalue()
        return 0

    assert await run(front) == 0


async def test_slash_commands_and_lazy_creation(tree, mock_llm_server_url):
    run, options, model, _ = tree
    configure_mock_llm(mock_llm_server_url, [{"text": "ONE"}, {"text": "TWO"}], key=model)
    lines = ScriptedLines("/history", "/switch", "/bogus", "first", "/switch 9", "/switch conv_nope",
                          "/new", "/history", "second", "/switch", "/switch 2", "/help", "/quit",
                          "never sent", interactive=False)

    async def front(client: OmnigentClient) -> int:
        repl, screen = _repl(client, options, None, lines)
        code = await repl.run()
        out = screen.getvalue()
        sessions = await client.list_sessions()
        assert len(sessions) == 2  # /new made the second one, on its first message
        second, first = sessions[0]["id"], sessions[1]["id"]
        expected_in_order = [
            "No conversation yet",                     # /history before any message
            "  No sessions.",                          # /switch with none
            "Unknown command /bogus: type /help",      # one-line hint
            "ONE",
            "No session #9 (1 listed). Run /switch with no argument to see the table.",
            "Error: Conversation 'conv_nope' not found.",
            "New conversation",
            "No conversation yet",                     # /history after /new
            "TWO",
            "Switch to…",
            second,                                    # newest first
            first,
            "  /switch <#> or <id> to resume",
            f"Resumed conversation {first}",
            "› first\nONE\n",                          # its history, and not the other's
            "/history           show the whole conversation again",
            f"--resume {first}",                       # the exit hint names the attached one
        ]
        pos = 0
        for text in expected_in_order:
            found = out.find(text, pos)
            assert found >= 0, f"{text!r} not found after position {pos} in:\n{out}"
            pos = found + len(text)
        assert "state:" not in out and "❯" not in out  # a pipe gets no prompt or status line
        assert len(mock_requests(mock_llm_server_url, model)) == 2  # nothing after /quit
        return code

    assert await run(front) == 0


async def test_a_failed_turn_in_a_pipe_exits_1_and_the_next_line_still_runs(tree, mock_llm_server_url):
    run, options, model, _ = tree
    configure_mock_llm(mock_llm_server_url, [
        {"error": "the model is on fire", "status_code": 400, "should_retry": False},
        {"text": "RECOVERED"},
    ], key=model)
    lines = ScriptedLines("doomed", "again", interactive=False)
    lines.feed(None)

    async def front(client: OmnigentClient) -> int:
        repl, screen = _repl(client, options, None, lines)
        code = await repl.run()
        out = screen.getvalue()
        assert "Error: " in out and "RECOVERED" in out and out.index("Error: ") < out.index("RECOVERED")
        return code

    assert await run(front) == 1


async def test_history_of_1000_turns(tree, mock_llm_server_url):
    """Timing is printed, not asserted (the issue's target: /history in at most 0.5 s)."""
    run, options, _, db_path = tree
    spec = load_spec(options.agent_path)
    with Store(db_path) as store:
        agent = store.upsert_agent(spec.name, spec.to_dict(), options.bundle)
        conv = store.create_conversation(agent_id=agent["id"])
        for n in range(1000):
            store.append_item(conv["id"], {"type": "message", "role": "user",
                                           "content": [{"type": "input_text", "text": f"question {n}"}]})
            store.append_item(conv["id"], {"type": "message", "role": "assistant",
                                           "content": [{"type": "output_text", "text": f"answer {n}"}]})
    lines = ScriptedLines()

    async def front(client: OmnigentClient) -> int:
        repl, screen = _repl(client, options, conv["id"], lines)
        async with trio.open_nursery() as nursery:
            started = trio.current_time()
            nursery.start_soon(repl.run)
            await screen.wait_for("answer 999\n")
            attached = trio.current_time()
            lines.feed("/history")
            await screen.wait_for("answer 999\n", count=2)
            shown = trio.current_time()
            lines.feed(None)
        print(f"\nresume with a 1,000-turn transcript: {attached - started:.3f} s; "
              f"/history of 1,000 turns: {shown - attached:.3f} s")
        assert screen.getvalue().count("› question 0\n") == 2
        return 0

    assert await run(front) == 0


async def test_the_repl_says_when_the_warm_spare_may_start(tree, mock_llm_server_url):
    """`options.idle` (the local tree's spare gate): in a pipe after the first turn, not before;
    on a terminal already at the first prompt, where a person takes seconds to type."""
    run, options, model, _ = tree
    configure_mock_llm(mock_llm_server_url, [{"text": "ONE"}], key=model)
    calls: list[int] = []  # how many answers the model had given at each call
    options.idle = lambda: calls.append(len(mock_requests(mock_llm_server_url, model)))
    piped = ScriptedLines("/help", "first", None, interactive=False)
    on_tty = ScriptedLines(None)

    async def front(client: OmnigentClient) -> int:
        repl, _ = _repl(client, options, None, piped)
        assert await repl.run() == 0
        assert calls and calls[0] == 1  # not for /help: only once the turn was done
        calls.clear()
        repl, _ = _repl(client, options, None, on_tty)
        assert await repl.run() == 0
        assert calls == [1]  # at the first prompt, before any turn
        return 0

    assert await run(front) == 0
