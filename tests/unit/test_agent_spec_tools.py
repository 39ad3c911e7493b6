"""What an agent may do, in its spec: tools, permissions, max_steps, tool_timeout.

The server's loop and the runner read these keys from `AgentSpec.to_dict()`
(CONTRACT9.md, "Tool names and spec"); a file is strict about them, a spec
stored by another release is not (it must keep serving turns).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from omnigent.agents import AgentSpec, SpecError, load_spec
from omnigent.agents.actions import TOOL_NAMES

HEAD = "name: a\nprompt: x\nexecutor:\n  model: m\n"


def spec_of(tmp_path: Path, text: str) -> AgentSpec:
    path = tmp_path / "a.yaml"
    path.write_text(HEAD + text)
    return load_spec(path)


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(SpecError) as info:
        spec_of(tmp_path, text)
    message = str(info.value)
    assert "\n" not in message
    return message.split(": ", 1)[1]  # without the file name


def test_defaults_no_tools_ask_50_steps_120_s(tmp_path):
    d = spec_of(tmp_path, "").to_dict()
    assert (d["tools"], d["permissions"], d["max_steps"], d["tool_timeouts"]) == ([], "ask", 50, {"default": 120})


def test_every_key_at_the_top_level(tmp_path):
    spec = spec_of(tmp_path, "tools: [shell, read_file, write_file, edit_file, list_dir, grep]\n"
                             "permissions: auto\nmax_steps: 7\ntool_timeout: 30\n")
    assert spec.tools == TOOL_NAMES
    d = spec.to_dict()
    assert (d["permissions"], d["max_steps"], d["tool_timeouts"]) == ("auto", 7, {"default": 30})
    assert json.loads(json.dumps(d)) == d


def test_every_key_under_executor(tmp_path):
    text = ("  tools: [grep]\n  permissions: deny\n  max_steps: 3\n"
            "  tool_timeout: {shell: 300}\n")
    d = spec_of(tmp_path, text).to_dict()
    assert (d["tools"], d["permissions"], d["max_steps"]) == (["grep"], "deny", 3)
    assert d["tool_timeouts"] == {"default": 120, "shell": 300}


def test_a_timeout_mapping_may_set_the_default(tmp_path):
    assert spec_of(tmp_path, "tool_timeout: {default: 5, shell: 2.5}\n").tool_timeouts == {"default": 5, "shell": 2.5}


def test_the_dict_form_round_trips(tmp_path):
    spec = spec_of(tmp_path, "tools: [shell]\npermissions: deny\nmax_steps: 2\ntool_timeout: {shell: 9}\n")
    again = AgentSpec.from_dict(spec.to_dict())
    assert again == spec and again.to_dict() == spec.to_dict()


@pytest.mark.parametrize(("text", "expected"), [
    ("tools: [shel]\n", "tools[0]: unknown tool 'shel' (did you mean 'shell'? known: shell, read_file, "
                        "write_file, edit_file, list_dir, grep)"),
    ("tools: [browser]\n", "tools[0]: unknown tool 'browser' (known: shell, read_file, write_file, edit_file, "
                           "list_dir, grep)"),
    ("tools: shell\n", "tools: must be a list of tool names (known: shell, read_file, write_file, edit_file, "
                       "list_dir, grep), got a string"),
    ("tools: [grep, 3]\n", "tools[1]: must be a tool name, got an integer"),
    ("tools: [grep, grep]\n", "tools[1]: 'grep' is listed twice"),
    ("  tools: [nope]\n", "executor.tools[0]: unknown tool 'nope' (known: shell, read_file, write_file, "
                          "edit_file, list_dir, grep)"),
    ("  tools: [shell]\ntools: [grep]\n", "'tools' and 'executor.tools' disagree; keep one"),
    ("permissions: always\n", "permissions: unknown permission mode 'always' (known: ask, auto, deny)"),
    ("permissions: 1\n", "permissions: must be one of ask, auto, deny, got an integer"),
    ("max_steps: 0\n", "max_steps: must be between 1 and 10000 (got 0)"),
    ("max_steps: 2.5\n", "max_steps: must be a whole number of model steps, got a number"),
    ("max_steps: true\n", "max_steps: must be a whole number of model steps, got a boolean"),
    ("tool_timeout: -1\n", "tool_timeout: must be more than 0 and at most 86400 seconds (got -1)"),
    ("tool_timeout: .inf\n", "tool_timeout: must be more than 0 and at most 86400 seconds (got inf)"),
    ("tool_timeout: soon\n", "tool_timeout: must be a number of seconds, got a string"),
    ("tool_timeout: {shel: 3}\n", "tool_timeout.shel: unknown key (did you mean 'shell'? known: default, shell, "
                                  "read_file, write_file, edit_file, list_dir, grep)"),
    ("tool_timeout: {grep: '3'}\n", "tool_timeout.grep: must be a number of seconds, got a string"),
])
def test_bad_values_are_one_line_naming_the_field(tmp_path, text, expected):
    assert error_of(tmp_path, text) == expected


def test_agreeing_duplicates_are_fine(tmp_path):
    assert spec_of(tmp_path, "  permissions: ask\npermissions: ASK\n").permissions == "ask"


def test_a_stored_spec_keeps_loading_with_the_safe_defaults(caplog):
    stored = {"raw": {"name": "old", "prompt": "x", "executor": {"model": "m"}, "tools": ["search", "grep"],
                      "permissions": "yolo", "max_steps": -3, "tool_timeout": "x"}}
    with caplog.at_level(logging.WARNING, logger="omnigent.agents"):
        for _ in range(2):
            spec = AgentSpec.from_dict(stored, source="agent 'old'")
    assert (spec.tools, spec.permissions, spec.max_steps, spec.tool_timeouts) == (
        ("grep",), "ask", 50, {"default": 120})
    warned = [r.getMessage() for r in caplog.records if r.name == "omnigent.agents"]
    assert len(warned) == 4 and warned[0] == (
        "agent 'old': tools[0]: unknown tool 'search', ignored (stored by another release)"), warned
