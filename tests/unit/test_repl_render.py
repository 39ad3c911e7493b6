"""Unit tests of the REPL's pure parts: rendering, the console's late-output rule, pipe input."""

from __future__ import annotations

import io

import trio
import trio.testing

from omnigent.repl.render import (
    Console,
    LiveRenderer,
    Style,
    age,
    picker_list,
    render_item,
    session_table,
    transcript,
)
from omnigent.repl.table import display_width
from omnigent.repl.terminal import PipeInput
from protocol import events as ev

PLAIN = Style(False)


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def assistant(text: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def test_transcript_shows_user_and_assistant_turns_and_tools():
    items = [user("hi\nthere"), assistant("hello"),
             {"type": "function_call", "name": "get_time", "arguments": '{"tz": "UTC"}'},
             {"type": "function_call_output", "output": "12:00"},
             {"type": "reasoning", "summary": []}, {"type": "mystery"}]
    assert transcript(items, PLAIN) == (
        "› hi\n  there\nhello\n  ⚙ get_time({\"tz\": \"UTC\"})\n  ↳ 12:00\n")
    assert transcript([], PLAIN) == ""
    assert "❯" not in transcript(items, PLAIN)  # the prompt glyph is a readiness marker


def test_styles_wrap_text_without_splitting_it():
    assert render_item(user("x"), Style(True)) == "\x1b[1m› x\x1b[0m"
    assert render_item(assistant("SESSION_OK"), Style(True)) == "SESSION_OK"


def test_switch_table_lists_full_ids_newest_first_and_the_hint():
    rows = [{"id": "conv_" + "b" * 32, "title": "", "status": "idle", "created_at": 0},
            {"id": "conv_" + "a" * 32, "title": "x" * 80, "status": "running", "created_at": 0}]
    table = session_table(rows)
    lines = table.splitlines()
    assert lines[0] == "Switch to…"
    assert lines[1].split() == ["#", "ID", "Title", "Status", "Created"]
    assert lines[2].split()[:4] == ["1", rows[0]["id"], "(untitled)", "idle"]
    assert "x" * 39 + "…" in lines[3]
    assert lines[-1] == "  /switch <#> or <id> to resume"
    assert session_table([]) == "  No sessions.\n"


def test_picker_list_and_ages():
    assert [age(s) for s in (5, 59, 60, 3599, 7200, 86400 * 3)] == [
        "just now", "just now", "1 min ago", "59 min ago", "2 h ago", "3 d ago"]
    listing = picker_list([{"id": "conv_1", "title": "plan", "updated_at": 1000.0, "message_count": 4},
                           {"id": "conv_2", "title": "", "updated_at": 1120.0, "message_count": 1}], 1120.0)
    assert [line.split() for line in listing.splitlines()] == [
        ["1.", "plan", "2", "min", "ago", "4", "messages", "conv_1"],
        ["2.", "(untitled)", "just", "now", "1", "message", "conv_2"],
    ]


def _console(shown: list[str | None]) -> tuple[Console, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    return Console(tty=True, shown_prompt=lambda: shown[0], out=out, err=err), out, err


def test_console_prints_late_output_above_the_prompt_whole_lines_only():
    shown: list[str | None] = ["❯ draft"]
    console, out, err = _console(shown)
    console.write("partial ")
    assert out.getvalue() == ""  # held until its line is complete
    console.write("line\nnext")
    assert out.getvalue() == "\r\x1b[Kpartial line\n❯ draft"
    console.notice("runner lost")  # ends the held line first, then the notice, then the prompt again
    assert out.getvalue() == "\r\x1b[Kpartial line\n❯ draft\r\x1b[Knext\n❯ draft\r\x1b[K❯ draft"
    assert err.getvalue() == "runner lost\n"


def test_console_writes_held_late_text_once_the_prompt_is_gone():
    shown: list[str | None] = ["❯ "]
    console, out, _ = _console(shown)
    console.write("stream")
    shown[0] = None  # the user pressed Enter
    console.write(" continues\n")
    assert out.getvalue() == "stream continues\n"


def test_no_status_line_without_a_terminal():
    out = io.StringIO()
    console = Console(tty=False, out=out, err=io.StringIO(), clock=lambda: 0.0)
    console.before_read()
    console.after_read()
    console.turn_started()
    console.write("answer\n")
    console.tick()
    console.turn_ended()
    console.before_read()
    console.after_read(eof=True)
    assert out.getvalue() == "answer\n"
    assert "state:" not in out.getvalue()


def _screen(shown: list[str | None], now: list[float]) -> tuple[Console, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    console = Console(tty=True, shown_prompt=lambda: shown[0], out=out, err=err, screen=True,
                      clock=lambda: now[0])
    console.style = PLAIN  # the escape sequences of the layout are what is tested, not the dimming
    return console, out, err


def test_the_status_line_is_redrawn_in_place_never_appended():
    shown: list[str | None] = [None]
    now = [100.0]
    console, out, err = _screen(shown, now)
    console.before_read()  # the prompt's line stays free; `state: sleeping` goes on the line below
    assert out.getvalue() == "\nstate: sleeping\x1b[K\x1b[1A\r"
    console.after_read()  # Enter moved the cursor onto the status line: it is erased
    assert out.getvalue().endswith("\r\x1b[K")
    out.truncate(0), out.seek(0)
    console.turn_started()
    assert out.getvalue() == "state: running · 0 s"
    now[0] = 104.6
    console.tick()
    console.tokens(812)
    assert out.getvalue() == ("state: running · 0 s\r\x1b[Kstate: running · 4 s"
                              "\r\x1b[Kstate: running · 4 s · 812 tokens")
    out.truncate(0), out.seek(0)
    console.write("Reply: SESSION_LIFECYCLE_OK\n")  # output goes above the status, which follows it
    console.notice("a notice")
    assert out.getvalue() == ("\r\x1b[KReply: SESSION_LIFECYCLE_OK\nstate: running · 4 s · 812 tokens"
                              "\r\x1b[Kstate: running · 4 s · 812 tokens")
    assert err.getvalue() == "a notice\n"
    out.truncate(0), out.seek(0)
    now[0] = 112.0
    console.turn_ended()
    assert out.getvalue() == "\r\x1b[K"  # no state line is left in the scrollback
    console.before_read()
    assert "state: sleeping · last turn 12 s · 812 tokens" in out.getvalue()


def test_late_output_at_the_prompt_redraws_the_status_and_the_prompt_bytes():
    shown: list[str | None] = [None]
    console, out, _ = _screen(shown, [0.0])
    console.before_read()
    shown[0] = "❯ dra"
    out.truncate(0), out.seek(0)
    console.write("late line\n")
    assert out.getvalue() == "\r\x1b[Jlate line\n\nstate: sleeping\x1b[K\x1b[1A\r❯ dra"
    shown[0] = None
    console.after_read(eof=True)  # Ctrl-D: the newline is ours, then the status line goes
    assert out.getvalue().endswith("❯ dra\n\r\x1b[K")


def test_an_approval_question_suspends_the_running_status():
    shown: list[str | None] = [None]
    console, out, _ = _screen(shown, [0.0])
    console.turn_started()
    out.truncate(0), out.seek(0)
    console.before_read(sleeping=False)
    assert out.getvalue() == "\r\x1b[K"  # the question is written on a clean line
    console.after_read()
    assert out.getvalue() == "\r\x1b[Kstate: running · 0 s"
    out.truncate(0), out.seek(0)
    console.interrupted()  # ^C was echoed after the status: the line is drawn again, clean
    assert out.getvalue() == "\r\x1b[Kstate: running · 0 s"


def test_status_words():
    from omnigent.repl.status import Status, elapsed, total_tokens

    assert [elapsed(s) for s in (0.4, 59.9, 65, 3725)] == ["0 s", "59 s", "1 min 05 s", "1 h 02 min"]
    assert total_tokens({"input_tokens": 3, "output_tokens": 4}) == 7
    assert total_tokens({"total_tokens": 9, "input_tokens": 3}) == 9
    assert total_tokens(None) is None and total_tokens({}) is None
    status = Status()
    assert status.text(0) == "state: sleeping"
    status.start(10)
    status.tokens = 1234
    assert status.text(12) == "state: running · 2 s · 1,234 tokens"
    status.stop(13)
    assert status.text(20) == "state: sleeping · last turn 3 s · 1,234 tokens"


def test_renderer_shows_an_answer_once_from_deltas_item_or_completion():
    console, out, err = _console([None])
    r = LiveRenderer(console)
    r.event({"type": ev.RESPONSE_CREATED, "turn_id": "t1", "attempt": 1})
    r.event({"type": ev.TEXT_DELTA, "turn_id": "t1", "delta": "Hel"})
    r.event({"type": ev.TEXT_DELTA, "turn_id": "t1", "delta": "lo"})
    r.event({"type": ev.ITEM_DONE, "turn_id": "t1", "item": assistant("Hello")})
    r.event({"type": ev.COMPLETED, "turn_id": "t1", "response": {"output": [assistant("Hello")]}})
    r.event({"type": ev.ITEM_DONE, "turn_id": "t2", "item": assistant("no deltas")})
    r.event({"type": ev.COMPLETED, "turn_id": "t2", "response": {"output": [assistant("no deltas")]}})
    r.event({"type": ev.COMPLETED, "turn_id": "t3", "response": {"output": [assistant("only here")]}})
    assert out.getvalue() == "Hello\nno deltas\nonly here\n"
    r.event({"type": ev.FAILED, "turn_id": "t4", "error": {"code": "x", "message": "boom"}})
    r.event({"type": ev.CANCELLED, "turn_id": "t5"})
    assert err.getvalue() == "Error: boom\n(cancelled)\n"


def test_a_runner_incident_is_one_notice_line():
    console, _, err = _console([None])
    r = LiveRenderer(console)
    r.event({"type": ev.RUNNER_LOST, "runner_id": "runner_ab12ef", "cause": "killed by SIGKILL"})
    r.event({"type": ev.RUNNER_REBOUND, "old_runner_id": "runner_ab12ef", "new_runner_id": "runner_cd34ef",
             "cause": "killed by SIGKILL", "downtime": 0.18, "retrying": True})
    r.event({"type": ev.RUNNER_REBOUND, "old_runner_id": "runner_cd34ef", "new_runner_id": "runner_ef56ab",
             "cause": "exited with code 3", "downtime": 1.5, "retrying": False})
    r.event({"type": ev.RUNNER_REBOUND, "old_runner_id": "runner_ef56ab", "new_runner_id": "runner_0000ab",
             "cause": "hung: no answer to pings for 4.0 s; killed by SIGKILL", "downtime": 4.0})
    r.event({"type": ev.RUNNERS_GAVE_UP, "reason": "exited with code 3 before it was ready\nImportError: x"})
    assert err.getvalue().splitlines() == [
        "runner runner_ab12… died (SIGKILL); replaced by runner_cd34… in 0.18 s; retrying your turn",
        "runner runner_cd34… died (exit code 3); replaced by runner_ef56… in 1.50 s",
        "runner runner_ef56… died (hung: no answer to pings for 4.0 s); replaced by runner_0000… in 4.00 s",
        "Error: runners cannot stay up: exited with code 3 before it was ready",
        "ImportError: x",
    ]


def test_renderer_starts_a_retried_answer_over_on_a_new_line():
    console, out, err = _console([None])
    r = LiveRenderer(console)
    r.event({"type": ev.TEXT_DELTA, "turn_id": "t1", "delta": "half"})
    r.event({"type": ev.RESPONSE_CREATED, "turn_id": "t1", "attempt": 2})
    r.event({"type": ev.ITEM_DONE, "turn_id": "t1", "item": assistant("whole")})
    assert out.getvalue() == "half\nwhole\n"
    assert err.getvalue() == ""  # the rebound notice already said "retrying your turn"


async def test_pipe_input_splits_lines_across_chunks_and_ends_with_eof():
    send, receive = trio.testing.memory_stream_one_way_pair()
    lines = PipeInput(receive)
    await send.send_all(b"first\r\nsec")
    async with trio.open_nursery() as nursery:
        async def finish() -> None:
            await send.send_all("ond ❯\n\nlast".encode())
            await send.aclose()
        nursery.start_soon(finish)
        assert await lines.read("") == "first"
        assert await lines.read("") == "second ❯"
    assert await lines.read("") == ""
    assert await lines.read("") == "last"
    try:
        await lines.read("")
    except EOFError:
        pass
    else:
        raise AssertionError("no EOFError at the end of input")


def test_live_renderer_says_retries_and_textless_answers_in_one_line():
    out, err = io.StringIO(), io.StringIO()
    live = LiveRenderer(Console(tty=False, out=out, err=err))
    live.event({"type": ev.RESPONSE_CREATED, "turn_id": "t1", "attempt": 1})
    live.event({"type": ev.MODEL_RETRY, "turn_id": "t1", "error": "model error 429 (rate limited)",
                "attempt": 2, "attempts": 3, "delay": 1.234})
    live.event({"type": ev.ITEM_DONE, "turn_id": "t1", "item": {"type": "reasoning", "summary": []}})
    live.event({"type": ev.COMPLETED, "turn_id": "t1",
                "response": {"output": [{"type": "reasoning", "summary": []}]}})
    live.event({"type": ev.RESPONSE_CREATED, "turn_id": "t2", "attempt": 1})
    live.event({"type": ev.COMPLETED, "turn_id": "t2", "response": {"output": []}})
    assert out.getvalue() == ""  # no empty answer line
    assert err.getvalue().splitlines() == [
        "model error 429 (rate limited); retrying in 1.2 s (attempt 2 of 3)",
        "(the model answered with reasoning only, no text)",
        "(the model's answer was empty)",
    ]


def test_live_renderer_keeps_a_dropped_streams_text_and_says_why():
    out, err = io.StringIO(), io.StringIO()
    live = LiveRenderer(Console(tty=False, out=out, err=err))
    live.event({"type": ev.TEXT_DELTA, "turn_id": "t1", "delta": "half an"})
    live.event({"type": ev.FAILED, "turn_id": "t1",
                "error": {"code": "stream_dropped", "message": "the model's stream ended after 7 characters"}})
    assert out.getvalue() == "half an\n"
    assert err.getvalue() == "Error: the model's stream ended after 7 characters\n"


def test_input_that_took_two_rows_leaves_no_tail_of_the_status(monkeypatch):
    monkeypatch.setenv("COLUMNS", "20")
    monkeypatch.setenv("LINES", "10")
    console, out, _ = _screen([None], [0.0])
    console.before_read()
    out.truncate(0), out.seek(0)
    console.after_read(shown="❯ " + "x" * 23)  # 25 columns: its second row went over the status line
    assert out.getvalue() == "\r\x1b[K\x1b[1A\r\x1b[5C\x1b[K\n"
    console.before_read()
    out.truncate(0), out.seek(0)
    console.after_read(shown="❯ short")
    assert out.getvalue() == "\r\x1b[K"
    console.turn_started()
    assert display_width(out.getvalue().split("\r\x1b[K")[-1]) <= 19  # the status never wraps


def test_markdown_only_on_a_screen_without_no_color(monkeypatch):
    out = io.StringIO()
    assert not Console(tty=True, out=out, markdown=True).markdown  # not a terminal
    assert Console(tty=True, out=out, markdown=True, screen=True).markdown
    assert not Console(tty=True, out=out, markdown=False, screen=True).markdown  # --raw
    monkeypatch.setenv("NO_COLOR", "1")
    console = Console(tty=True, out=out, markdown=True, screen=True)
    assert not console.markdown and not console.style.enabled


def test_the_live_renderer_renders_streamed_markdown_line_by_line():
    console, out, _ = _screen([None], [0.0])
    console.markdown = True
    r = LiveRenderer(console)
    r.event({"type": ev.RESPONSE_CREATED, "turn_id": "t1", "attempt": 1})
    r.event({"type": ev.TEXT_DELTA, "turn_id": "t1", "delta": "**Reply**: SESSION_"})
    assert out.getvalue() == ""  # the line is not complete yet
    r.event({"type": ev.TEXT_DELTA, "turn_id": "t1", "delta": "LIFECYCLE_OK\na_b"})
    assert out.getvalue() == "\x1b[1mReply\x1b[0m: SESSION_LIFECYCLE_OK\n"
    r.event({"type": ev.USAGE, "turn_id": "t1", "turn": {"total_tokens": 3}})  # prints nothing: still held
    assert out.getvalue().endswith("OK\n")
    r.event({"type": ev.ITEM_DONE, "turn_id": "t1", "item": assistant("**Reply**: SESSION_LIFECYCLE_OK\na_b")})
    assert out.getvalue() == "\x1b[1mReply\x1b[0m: SESSION_LIFECYCLE_OK\na_b\n"
    r.event({"type": ev.COMPLETED, "turn_id": "t1", "response": {"output": []}})
    items = [user("q"), assistant("*x*"), user("again")]
    turns = [{"input_item_id": "u1", "status": "cancelled"}, {"input_item_id": "u2", "status": "completed"}]
    items[0]["id"], items[2]["id"] = "u1", "u2"
    assert transcript(items, PLAIN, r.markdown, turns) == "› q\n\x1b[3mx\x1b[0m\n  (cancelled)\n› again\n"


def test_output_between_the_status_and_the_prompt_keeps_the_status_below():
    console, out, err = _screen([None], [0.0])
    console.before_read()
    out.truncate(0), out.seek(0)
    console.notice("approval answered elsewhere")
    assert out.getvalue() == "\r\x1b[J\nstate: sleeping\x1b[K\x1b[1A\r"
    assert err.getvalue() == "approval answered elsewhere\n"


def test_run_has_a_raw_flag_that_reaches_the_front_options():
    from click.testing import CliRunner

    from omnigent.cli import cli
    from omnigent.repl.options import FrontOptions

    assert "--raw" in CliRunner().invoke(cli, ["run", "--help"]).output
    assert FrontOptions(agent_path="a", agent_name="a", bundle=b"").raw is False
