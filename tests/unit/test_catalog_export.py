"""`omnigent sessions show/export/list` formatting: pure functions over a session and its items."""

from __future__ import annotations

import json
import re

from omnigent.catalog import export
from omnigent.catalog.backend import public_row
from omnigent.catalog.listing import display_width, format_table, table

SESSION = public_row({"id": "conv_1", "title": "Plan a trip", "agent_name": "planner", "created_at": 1_700_000_000.0,
                      "updated_at": 1_700_000_060.0, "message_count": 2, "item_count": 4, "forked_from": "conv_0",
                      "kind": 1, "generation": 3})
ITEMS = [
    {"id": "msg_u", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Where to?\nSomewhere warm"}],
     "status": "completed", "response_id": None, "created_at": 1_700_000_001.0},
    {"id": "fc_1", "type": "function_call", "name": "shell", "arguments": "{\"command\": \"ls\"}", "call_id": "c1",
     "status": "completed", "response_id": "resp_1", "created_at": 1_700_000_002.0},
    {"id": "fco_1", "type": "function_call_output", "call_id": "c1", "output": "a.txt\nb.txt\nexit code: 0",
     "status": "completed", "response_id": "resp_1", "created_at": 1_700_000_003.0},
    {"id": "msg_a", "type": "message", "role": "assistant", "status": "completed", "response_id": "resp_1",
     "content": [{"type": "output_text", "text": "Try Lisbon.\n```sh\necho ```\n```\n\x1b[31mred\x1b[0m"}],
     "created_at": 1_700_000_004.0},
]


def test_public_row_keeps_the_shared_fields_only():
    assert set(SESSION) == {"id", "title", "agent_name", "created_at", "updated_at", "message_count", "item_count",
                            "forked_from", "workspace"}
    assert public_row({"id": "c", "title": None})["title"] == "" and "snippet" in public_row({"id": "c", "snippet": "x"})


def test_transcript_reads_like_the_repl_and_neutralises_control_characters():
    text = export.transcript(SESSION, ITEMS)
    assert text.startswith("Plan a trip\nconv_1 · planner · 2 messages · updated ")
    assert "forked from conv_0\n" in text
    assert "› Where to?\n  Somewhere warm\n" in text
    assert '  ⚙ shell {"command": "ls"}\n' in text
    assert "  ↳ a.txt  (+2 lines)\n" in text
    assert "\x1b" not in text and "^[[31mred^[[0m" in text


def test_markdown_has_a_title_facts_sections_and_fences_longer_than_any_inside():
    md = export.markdown(SESSION, ITEMS)
    assert md.startswith("# Plan a trip\n\n- **Session:** `conv_1`\n- **Agent:** planner\n")
    assert "- **Forked from:** `conv_0`" in md
    assert "## User\n\nWhere to?\nSomewhere warm\n" in md
    assert '**Tool call** `shell`\n\n```json\n{"command": "ls"}\n```' in md
    assert "**Tool result**\n\n```\na.txt\nb.txt\nexit code: 0\n```" in md
    assert "## Assistant\n\nTry Lisbon." in md
    assert "\x1b" not in md
    # a tool output holding a fence is wrapped in a longer one
    fenced = export.markdown(SESSION, [{**ITEMS[2], "output": "```\nx\n```"}])
    assert "````\n```\nx\n```\n````" in fenced
    assert export.markdown(public_row({"id": "c"}), []).startswith("# Untitled session\n")


def test_jsonl_is_a_session_line_then_every_item_exactly():
    lines = list(export.jsonl(SESSION, ITEMS))
    assert all(line.endswith("\n") and line.count("\n") == 1 for line in lines)
    first, *rest = (json.loads(line) for line in lines)
    assert first == {"type": "session", **SESSION}
    assert rest == ITEMS  # every character kept, the escape included


def test_json_escapes_c1_controls_and_keeps_other_text_as_is():
    line = export.dumps({"t": "日本\x9b[31m"})
    assert "日本" in line and "\\u009b" in line and "\x9b" not in line
    assert json.loads(export.document(SESSION, ITEMS))["items"] == ITEMS


def test_table_aligns_wide_characters_and_cuts_the_last_column():
    lines = format_table(["A", "NAME"], [["日本語", "x"], ["ab", "a long name here"]], max_width=12)
    assert display_width(lines[1][: lines[1].index("x")]) == display_width(lines[2][: lines[2].index("a l")]) == 8
    assert lines[2].endswith("…") and display_width(lines[2]) <= 12
    assert display_width("e\u0301") == 1


def test_listing_shows_names_and_search_matches():
    rows = [public_row({"id": "conv_a", "title": "日本語 trip", "agent_name": "p", "updated_at": 100.0,
                        "message_count": 3}), public_row({"id": "conv_b", "title": "", "updated_at": 0.0})]
    lines = table(rows, 100.0 + 7200)
    assert re.split(r"\s{2,}", lines[0]) == ["ID", "UPDATED", "MSGS", "AGENT", "NAME"]
    assert re.split(r"\s{2,}", lines[1]) == ["conv_a", "2 h ago", "3", "p", "日本語 trip"]
    assert lines[2].endswith("(untitled)")
    found = table([{**rows[0], "snippet": "a \x1b trip\nto Japan"}], 200.0)
    assert found[0].endswith("MATCH") and found[1].endswith("a ^[ trip to Japan")
