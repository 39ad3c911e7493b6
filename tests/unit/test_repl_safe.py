"""What reaches the terminal from the model, tools or the store: control characters neutralised."""

from __future__ import annotations

import io

from omnigent.repl.render import Console, LiveRenderer, Style, render_item, session_table, transcript
from omnigent.repl.safe import REPLACEMENT, neutralise
from protocol import events as ev


def test_c0_controls_become_caret_notation_and_newlines_and_tabs_stay():
    assert neutralise("a\x1b[31mred\x1b[0m") == "a^[[31mred^[[0m"
    assert neutralise("ding\x07") == "ding^G"
    assert neutralise("x\x00y\x08z\x7f") == "x^@y^Hz^?"
    assert neutralise("line one\n\tindented\n") == "line one\n\tindented\n"


def test_c1_controls_become_the_replacement_character():
    # CSI in its one-character C1 form would clear the screen without any ESC
    assert neutralise("\x9b2J\x9b31m") == f"{REPLACEMENT}2J{REPLACEMENT}31m"
    assert neutralise("\x85\x90\x9d\x9f") == REPLACEMENT * 4
    assert neutralise("é ❯ 日本") == "é ❯ 日本"  # printable non-ASCII is kept


def test_carriage_return_tricks_are_visible_but_crlf_is_a_line_end():
    # "ok" overprinting "rm -rf ~" on the same line
    assert neutralise("rm -rf ~\rok      ") == "rm -rf ~^Mok      "
    assert neutralise("a\r\nb\r\n") == "a\nb\n"
    assert "\x1b" not in neutralise("\x1b]0;title\x07") and neutralise("\x1b]0;title\x07") == "^[]0;title^G"


def _item(role, text):
    kind = "input_text" if role == "user" else "output_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def test_transcripts_and_tables_never_carry_escape_sequences_from_the_store():
    plain = Style(False)
    items = [_item("user", "hi\x1b[2J"), _item("assistant", "yo\x9b2J\rX"),
             {"type": "function_call", "name": "shell", "call_id": "c1", "arguments": '{"command": "echo \\u001b[31m"}'},
             {"type": "function_call_output", "call_id": "c1", "output": "\x1b[31mred\nexit code: 0"}]
    text = transcript(items, plain)
    assert "\x1b" not in text and "\x9b" not in text and "\r" not in text
    assert "^[[2J" in text and "  ⚙ shell: echo ^[[31m" in text and "  ↳ ^[[31mred · exit code 0" in text
    table = session_table([{"id": "conv_1", "title": "evil\x1b]0;pwn\x07", "status": "idle", "created_at": 0}])
    assert "\x1b" not in table and "\x07" not in table
    # styling is added after neutralising: the only ESC is omnigent's own SGR
    styled = render_item(_item("user", "\x1b[5m"), Style(True))
    assert styled == "\x1b[1m› ^[[5m\x1b[0m"


def test_live_text_deltas_are_neutralised_and_a_split_crlf_is_one_line_end():
    out, err = io.StringIO(), io.StringIO()
    renderer = LiveRenderer(Console(tty=False, out=out, err=err))
    for delta in ("one\r", "\ntwo\r", "X\x1b[8m", "\x9b"):
        renderer.event({"type": ev.TEXT_DELTA, "turn_id": "t", "delta": delta})
    renderer.event({"type": ev.FAILED, "turn_id": "t", "error": {"message": "bad \x1b[31m"}})
    assert out.getvalue() == f"one\ntwo^MX^[[8m{REPLACEMENT}\n"
    assert err.getvalue() == "Error: bad ^[[31m\n"
