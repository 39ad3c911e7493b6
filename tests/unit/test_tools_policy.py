"""The pure parts of the tools package: names, modes, approval targets, definitions, env scrubbing."""

from __future__ import annotations

import json

from omnigent.tools import definitions, redact, scrub_env, secret_values
from omnigent.tools.policy import (MODES, SIDE_EFFECTING, TOOL_NAMES, allowed, approval_target,
                                   needs_approval, strictest)


def test_names_and_side_effects():
    assert TOOL_NAMES == ("shell", "read_file", "write_file", "edit_file", "list_dir", "grep")
    assert SIDE_EFFECTING == {"shell", "write_file", "edit_file"}
    assert MODES == ("deny", "ask", "auto")


def test_strictest():
    assert strictest() == "ask"
    assert strictest(None, None) == "ask"
    assert strictest("auto", None) == "auto"
    assert strictest("auto", "ask") == "ask"
    assert strictest("auto", "deny", "ask") == "deny"
    assert strictest("auto", "bogus") == "deny"  # a typo never loosens


def test_needs_approval_and_allowed():
    assert needs_approval("shell", "ask") and not needs_approval("shell", "auto")
    assert not needs_approval("read_file", "ask")
    assert not allowed("write_file", "deny") and allowed("write_file", "auto")
    assert allowed("grep", "deny")
    assert not allowed("shell", "nonsense")


def test_approval_target():
    assert approval_target("shell", json.dumps({"command": "ls -la"})) == "ls -la"
    assert approval_target("write_file", json.dumps({"path": "./a/b.txt", "content": "x"})) == "./a/b.txt"
    assert approval_target("edit_file", "not json") == ""
    assert approval_target("shell", "[1]") == ""
    assert approval_target("shell", json.dumps({"command": 3})) == ""
    assert approval_target("nope", "{}") == ""


def test_definitions_are_deterministic_and_state_caps():
    one = definitions(["grep", "shell", "read_file", "write_file", "edit_file", "list_dir"])
    assert [d["name"] for d in one] == list(TOOL_NAMES)
    assert json.dumps(one) == json.dumps(definitions(list(reversed(TOOL_NAMES))))
    assert [list(d) for d in one] == [["name", "description", "parameters"]] * 6
    one[0]["parameters"]["properties"].clear()  # callers cannot mutate the source
    assert definitions(["shell"])[0]["parameters"]["properties"]
    by = {d["name"]: d for d in definitions(TOOL_NAMES)}
    assert "NOT confined" in by["shell"]["description"]
    assert all("NOT confined" not in d["description"] for n, d in by.items() if n != "shell")
    assert "2,000 lines" in by["read_file"]["description"] and "256 KiB" in by["read_file"]["description"]
    assert "1 MiB" in by["write_file"]["description"]
    assert "500 matches" in by["grep"]["description"]
    assert "64 KiB" in by["shell"]["description"]
    for d in by.values():
        assert d["parameters"]["type"] == "object"
        assert set(d["parameters"]["required"]) <= set(d["parameters"]["properties"])
    assert definitions([]) == [] and definitions(["unknown"]) == []


ENV = {
    "PATH": "/usr/bin", "HOME": "/home/u", "LANG": "C.UTF-8", "TERM": "xterm", "USER": "u", "SHELL": "/bin/bash",
    "OMNIGENT_RUNNER_TOKEN": "runner-token-value-123", "OMNIGENT_RUNNER_SECRET": "runner-secret-456789",
    "OMNIGENT_RUNNER_ID": "runner_abc", "OMNIGENT_HOST_SECRET": "host-secret-value",
    "OMNIGENT_REMOTE_AUTH_TOKEN": "remote-token-value", "OMNIGENT_SERVER_TOKEN": "server-token-value",
    "OPENAI_API_KEY": "sk-openai-key-value", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
    "ANTHROPIC_API_KEY": "anthropic-key-value", "GITHUB_TOKEN": "ghp_githubtokenvalue",
    "DB_PASSWORD": "short", "MY_SECRET": "my-secret-value", "github_token": "lowercase-token-value",
    "OMNIGENT_DATA_DIR": "/data", "EDITOR": "vi",
}


def test_scrub_env_keeps_ordinary_and_drops_credentials():
    kept = scrub_env(ENV)
    assert set(kept) == {"PATH", "HOME", "LANG", "TERM", "USER", "SHELL", "OMNIGENT_DATA_DIR", "EDITOR"}


def test_secret_values_are_the_long_dropped_ones():
    values = secret_values(ENV)
    assert "runner-token-value-123" in values and "sk-openai-key-value" in values
    assert "short" not in values  # < 8 characters: would redact ordinary words
    assert "/usr/bin" not in values
    assert values == sorted(values, key=lambda v: (-len(v), v))


def test_redact():
    assert redact("a runner-token-value-123 b", secret_values(ENV)) == "a [redacted] b"
    assert redact("abcdefgh-long abcdefgh", ["abcdefgh", "abcdefgh-long"]) == "[redacted] [redacted]"
    assert redact("nothing", []) == "nothing"
