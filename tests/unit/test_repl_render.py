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


def test_console_status_only_on_a_terminal():
    out = io.StringIO()
    Console(tty=False, out=out, err=io.StringIO()).status("sleeping")
    assert out.getvalue() == ""
    console, out, _ = _console([None])
    console.write("streamed")
    console.status("sleeping")
    assert out.getvalue() == "streamed\nstate: sleeping\n"


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
