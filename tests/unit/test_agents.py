"""Agent spec loading, validation, bundles and credential handling."""

from __future__ import annotations

import io
import json
import os
import pickle
import tarfile
from pathlib import Path

import logging

import pytest

from omnigent.agents import (
    DEFAULT_HARNESS,
    DEFAULT_MODEL,
    HARNESSES,
    AgentSpec,
    SpecError,
    bundle_bytes,
    bundle_from_spec,
    load_spec,
    resolve_auth,
    spec_from_bundle,
)

REPO = Path(__file__).resolve().parents[2]

BASIC = """\
name: hello_world
prompt: You are a friendly assistant. Reply briefly.
executor:
  model: databricks-claude-sonnet-4-6
"""


@pytest.fixture
def chdir_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def error_of(path, **kw) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(path, **kw)
    text = str(info.value)
    assert "\n" not in text and "\r" not in text
    return text


def tar_gz(members: dict[str, bytes], *, links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return buf.getvalue()


# --- loading ----------------------------------------------------------------


def test_constants():
    assert HARNESSES == ("openai-agents", "openai-chat")
    assert DEFAULT_HARNESS == "openai-agents"
    assert DEFAULT_MODEL == "gpt-4o-mini"


def test_load_valid(tmp_path):
    p = write(tmp_path / "hello_world.yaml", BASIC + "description: Greets people.\n")
    spec = load_spec(p)
    assert spec.name == "hello_world"
    assert spec.instructions == "You are a friendly assistant. Reply briefly."
    assert spec.harness == "openai-agents"  # defaulted
    assert spec.model == "databricks-claude-sonnet-4-6"
    assert spec.auth is None
    assert spec.reasoning_effort is None
    assert spec.source == str(p)
    assert spec.raw["description"] == "Greets people."
    assert spec.raw["executor"] == {"model": "databricks-claude-sonnet-4-6", "harness": "openai-agents"}


def test_repo_examples_load():
    hello = load_spec(REPO / "examples" / "hello.yaml")
    assert (hello.name, hello.harness, hello.model) == ("hello", "openai-agents", "gpt-4o-mini")
    hw = load_spec(REPO / "tests" / "resources" / "examples" / "hello_world.yaml")
    assert hw.name == "hello_world"
    assert hw.instructions == "You are a friendly assistant. Reply briefly."
    assert hw.model == "databricks-claude-sonnet-4-6"


@pytest.mark.parametrize("key", ["prompt", "instructions"])
def test_both_prompt_keys(tmp_path, key):
    p = write(tmp_path / "a.yml", f"name: a\n{key}: |\n  line one\n  line two\nexecutor: {{model: m}}\n")
    spec = load_spec(p)
    assert spec.instructions == "line one\nline two\n"
    assert spec.raw[key] == spec.instructions


def test_missing_model_is_an_error_unless_model_is_given(chdir_tmp):
    write(chdir_tmp / "a.yaml", "name: a\nprompt: x\n")
    write(chdir_tmp / "b.yaml", "name: b\nprompt: x\nexecutor: {harness: openai-chat}\n")
    for name in ("a.yaml", "b.yaml"):
        assert error_of(name) == f"{name}: 'executor.model' is missing (name the model to use, or pass --model)"
        assert load_spec(name, model="m").model == "m"
    assert load_spec("b.yaml", model="m").harness == "openai-chat"
    with pytest.raises(SpecError, match=r"^up/a\.yaml: 'executor\.model' is missing"):
        spec_from_bundle(bundle_bytes("a.yaml"), name_hint="up")  # uploads too


def test_stored_specs_without_model_load_as_before():
    # what earlier releases stored: the default model only when neither harness nor model was given
    spec = AgentSpec.from_dict({"raw": {"name": "a", "prompt": "x"}})
    assert (spec.harness, spec.model) == (DEFAULT_HARNESS, DEFAULT_MODEL)
    spec = AgentSpec.from_dict({"raw": {"name": "b", "prompt": "x", "executor": {"harness": "openai-chat"}}})
    assert (spec.harness, spec.model) == ("openai-chat", None)


def test_harness_canonicalized(tmp_path):
    p = write(tmp_path / "a.yaml", "name: a\nprompt: x\nexecutor: {harness: OpenAI_Chat, model: m}\n")
    assert load_spec(p).harness == "openai-chat"


def test_overrides(tmp_path):
    p = write(tmp_path / "a.yaml", BASIC)
    spec = load_spec(p, model="mock-model", harness="openai-chat", system_prompt="Be terse.")
    assert spec.model == "mock-model"
    assert spec.harness == "openai-chat"
    assert spec.instructions == "Be terse."
    assert spec.raw["prompt"] == "Be terse."
    assert spec.raw["executor"] == {"model": "mock-model", "harness": "openai-chat"}
    # the file itself is untouched
    assert p.read_text() == BASIC


def test_model_override_keeps_harness_default(tmp_path):
    p = write(tmp_path / "a.yaml", "name: a\nprompt: x\n")
    spec = load_spec(p, model="m")
    assert (spec.harness, spec.model) == (DEFAULT_HARNESS, "m")


def test_system_prompt_override_allows_missing_prompt(tmp_path):
    p = write(tmp_path / "a.yaml", "name: a\nexecutor: {model: m}\n")
    spec = load_spec(p, system_prompt="S")
    assert spec.instructions == "S"
    assert spec.raw["prompt"] == "S"
    p = write(tmp_path / "b.yaml", "name: b\ninstructions: old\nexecutor: {model: m}\n")
    assert load_spec(p, system_prompt="S").raw["instructions"] == "S"


def test_reasoning_effort(chdir_tmp):
    p = write(chdir_tmp / "a.yaml", "name: a\nprompt: x\nexecutor: {reasoning_effort: high, model: m}\n")
    assert load_spec(p).reasoning_effort == "high"
    p = write(chdir_tmp / "b.yaml", "name: b\nprompt: x\nreasoning_effort: low\nexecutor: {model: m}\n")
    assert load_spec(p).reasoning_effort == "low"
    write(chdir_tmp / "c.yaml", "name: c\nprompt: x\nreasoning_effort: low\nexecutor: {reasoning_effort: high, model: m}\n")
    assert error_of("c.yaml") == ("c.yaml: 'reasoning_effort' ('low') and 'executor.reasoning_effort' ('high') "
                                  "disagree; keep one")


def test_dates_stay_strings(tmp_path):
    p = write(tmp_path / "a.yaml", "name: a\nprompt: x\ndescription: 2024-01-01\nexecutor: {model: m}\n")
    spec = load_spec(p)
    assert spec.raw["description"] == "2024-01-01"
    json.dumps(spec.to_dict())


# --- unknown keys -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("executor: {modle: gpt-4o}\n", "agents/x.yaml: executor.modle: unknown key (did you mean 'model'?)"),
        ("executor: {model: m, harnes: openai-chat}\n", "agents/x.yaml: executor.harnes: unknown key (did you mean 'harness'?)"),
        ("descripton: hi\nexecutor: {model: m}\n", "agents/x.yaml: descripton: unknown key (did you mean 'description'?)"),
        ("model: gpt-4o\n", "agents/x.yaml: model: unknown key (did you mean 'executor.model'?)"),
        ("executor: {model: m}\nauth: {api_key: k}\n", "agents/x.yaml: auth: unknown key (did you mean 'executor.auth'?)"),
        ("executor: {model: m, auth: {apikey: k}}\n", "agents/x.yaml: executor.auth.apikey: unknown key (did you mean 'api_key'?)"),
        ("executor: {model: m, auth: {profile: p}}\n",
         "agents/x.yaml: executor.auth.profile: unknown key (known: type, api_key, base_url)"),
        ("executor: {model: m}\nskills: [a]\n", "agents/x.yaml: skills: unknown key (known: name, description, "
                                                  "prompt, instructions, reasoning_effort, tools, permissions, "
                                                  "max_steps, tool_timeout, executor)"),
    ],
)
def test_unknown_keys_are_errors_naming_the_nearest_key(chdir_tmp, text, expected):
    write(chdir_tmp / "agents" / "x.yaml", "name: a\nprompt: x\n" + text)
    assert error_of("agents/x.yaml") == expected


def test_unknown_keys_in_uploads_are_errors():
    with pytest.raises(SpecError) as info:
        spec_from_bundle(tar_gz({"config.yaml": BASIC.replace("model:", "modle:").encode()}), name_hint="up")
    assert str(info.value) == "up/config.yaml: executor.modle: unknown key (did you mean 'model'?)"


def test_one_list_of_keys():
    from omnigent.agents.keys import KEYS

    assert set(KEYS) == {"name", "description", "prompt", "instructions", "reasoning_effort", "executor",
                         "tools", "permissions", "max_steps", "tool_timeout"}
    assert set(KEYS["executor"]) == {"harness", "model", "auth", "reasoning_effort",
                                     "tools", "permissions", "max_steps", "tool_timeout"}
    assert set(KEYS["executor"]["auth"]) == {"type", "api_key", "base_url"}


def test_stored_specs_with_unknown_keys_load_and_log_once(caplog):
    stored = {"raw": {"name": "old", "prompt": "x", "skills": ["t"], "executor": {"model": "m", "profile": "p"}}}
    with caplog.at_level(logging.WARNING, logger="omnigent.agents"):
        for _ in range(3):
            spec = AgentSpec.from_dict(stored, source="agent 'old'")
    assert (spec.name, spec.model, spec.raw["skills"]) == ("old", "m", ["t"])
    warned = [r.getMessage() for r in caplog.records if r.name == "omnigent.agents"]
    assert warned == ["agent 'old': skills: unknown key, ignored (stored before agent files were strict)",
                      "agent 'old': executor.profile: unknown key, ignored (stored before agent files were strict)"]


# --- error messages ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("prompt: hi\n", "agents/x.yaml: 'name' is missing"),
        ("name: 3\nprompt: hi\n", "agents/x.yaml: name: must be a string, got an integer"),
        ("name: a b\nprompt: hi\n", "agents/x.yaml: name: may only hold letters, digits, '_', '.' and '-' (got 'a b')"),
        ("name: ''\nprompt: hi\n", "agents/x.yaml: name: may only hold letters, digits, '_', '.' and '-' (got '')"),
        ("name: a\n", "agents/x.yaml: 'prompt' (or 'instructions') is missing"),
        ("name: a\nprompt: 1\n", "agents/x.yaml: prompt: must be a string, got an integer"),
        ("name: a\ninstructions:\n", "agents/x.yaml: instructions: must be a string, got nothing (null)"),
        ("name: a\nprompt: x\ninstructions: y\n", "agents/x.yaml: 'prompt' and 'instructions' are both given; keep one"),
        ("- a\n", "agents/x.yaml: top level must be a mapping, got a list"),
        ("", "agents/x.yaml: empty: expected a mapping with 'name' and 'prompt'"),
        ("name: a\nprompt: x\nexecutor: [1]\n", "agents/x.yaml: executor: must be a mapping, got a list"),
        (
            "name: a\nprompt: x\nexecutor: {harness: foo}\n",
            "agents/x.yaml: executor.harness: unknown harness 'foo' (known: openai-agents, openai-chat)",
        ),
        ("name: a\nprompt: x\nexecutor: {model: 5}\n", "agents/x.yaml: executor.model: must be a string, got an integer"),
        ("name: a\nprompt: x\nexecutor: {model: ' '}\n", "agents/x.yaml: executor.model: must not be empty"),
        (
            "name: a\nprompt: x\nexecutor: {reasoning_effort: 1}\n",
            "agents/x.yaml: executor.reasoning_effort: must be a string, got an integer",
        ),
        ("name: a\nprompt: x\nexecutor: {auth: key}\n", "agents/x.yaml: executor.auth: must be a mapping, got a string"),
        (
            "name: a\nprompt: x\nexecutor: {auth: {type: databricks}}\n",
            "agents/x.yaml: executor.auth.type: unknown auth type 'databricks' (known: api_key)",
        ),
        (
            "name: a\nprompt: x\nexecutor: {auth: {profile: p}}\n",
            "agents/x.yaml: executor.auth.profile: unknown key (known: type, api_key, base_url)",
        ),
        (
            "name: a\nprompt: x\nexecutor: {auth: {api_key: 12}}\n",
            "agents/x.yaml: executor.auth.api_key: must be a string, got an integer",
        ),
        (
            "name: a\nprompt: x\nexecutor: {auth: {api_key: '${1BAD}'}}\n",
            "agents/x.yaml: executor.auth.api_key: bad variable reference '${1BAD}' (write ${NAME})",
        ),
        (
            "name: a\nprompt: x\nexecutor: {auth: {base_url: 'http://${HOST'}}\n",
            "agents/x.yaml: executor.auth.base_url: bad variable reference '${HOST' (write ${NAME})",
        ),
        ("name: a\nprompt: x\n1: 2\n", "agents/x.yaml: keys must be strings, got 1"),
        ("name: a\nprompt: x\nblob: !!binary aGk=\n", "agents/x.yaml: blob: unsupported YAML value of type bytes"),
        ("name: a\nprompt: [1\n  x: y\n", "agents/x.yaml: not valid YAML (line 3, column 4: did not find expected ',' or ']')"),
        ("a: b: c\n", "agents/x.yaml: not valid YAML (line 1, column 5: mapping values are not allowed in this context)"),
    ],
)
def test_error_messages(chdir_tmp, text, expected):
    write(chdir_tmp / "agents" / "x.yaml", text)
    assert error_of("agents/x.yaml") == expected


def test_override_errors_name_the_option(chdir_tmp):
    write(chdir_tmp / "x.yaml", "name: a\nprompt: x\n")
    assert error_of("x.yaml", harness="foo") == "x.yaml: --harness: unknown harness 'foo' (known: openai-agents, openai-chat)"
    assert error_of("x.yaml", model="") == "x.yaml: --model: must not be empty"


def test_yaml_alias_bomb_is_refused(chdir_tmp):
    rows = ["a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"]
    for prev, cur in zip("abcd", "bcde"):
        rows.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 10) + "]")
    write(chdir_tmp / "x.yaml", "\n".join(rows) + "\nname: a\nprompt: x\n")
    assert error_of("x.yaml") == "x.yaml: too large (over 100000 values once aliases are expanded)"


def test_recursive_alias_is_refused(chdir_tmp):
    write(chdir_tmp / "x.yaml", "name: a\nprompt: x\nloop: &l [*l]\n")
    assert error_of("x.yaml") == "x.yaml: loop: nested deeper than 64 levels"


def test_missing_file(chdir_tmp):
    assert error_of("nope.yaml") == "nope.yaml: no such file"
    with pytest.raises(SpecError, match=r"^nope\.yaml: no such file$"):
        bundle_bytes("nope.yaml")


def test_unknown_file_kind(chdir_tmp):
    write(chdir_tmp / "x.txt", "name: a\n")
    assert error_of("x.txt") == "x.txt: not an agent spec (expected a .yaml/.yml file, a directory or a .tar.gz bundle)"


def test_spec_error_pickles():
    e = SpecError("x.yaml", "must be a string", "name")
    again = pickle.loads(pickle.dumps(e))
    assert str(again) == "x.yaml: name: must be a string"
    assert (again.source, again.field, again.problem) == ("x.yaml", "name", "must be a string")


def test_spec_error_is_one_line():
    assert str(SpecError("x.yaml", "bad\n  thing\r\nhere")) == "x.yaml: bad thing here"


# --- directories ------------------------------------------------------------


def test_directory_with_config_yaml(chdir_tmp):
    write(chdir_tmp / "agent" / "config.yaml", BASIC)
    write(chdir_tmp / "agent" / "other.yaml", "name: other\nprompt: no\n")
    write(chdir_tmp / "agent" / "tools" / "mcp" / "x.yaml", "a: 1\n")
    spec = load_spec("agent")
    assert spec.name == "hello_world"
    assert spec.source == os.path.join("agent", "config.yaml")


def test_directory_with_single_yaml(chdir_tmp):
    write(chdir_tmp / "agent" / "mine.yml", BASIC)
    write(chdir_tmp / "agent" / "README.md", "hi")
    assert load_spec("agent").name == "hello_world"


def test_directory_single_yaml_errors_name_that_file(chdir_tmp):
    write(chdir_tmp / "agent" / "mine.yaml", "prompt: x\n")
    assert error_of("agent") == f"{os.path.join('agent', 'mine.yaml')}: 'name' is missing"


def test_directory_picks_the_one_agent_among_yamls(chdir_tmp):
    write(chdir_tmp / "agent" / "a.yaml", "servers: []\n")
    write(chdir_tmp / "agent" / "b.yaml", BASIC)
    assert load_spec("agent").name == "hello_world"


def test_directory_errors(chdir_tmp):
    (chdir_tmp / "empty").mkdir()
    assert error_of("empty") == "empty: no config.yaml and no .yaml/.yml file at its root"
    write(chdir_tmp / "two" / "a.yaml", "name: a\nprompt: x\n")
    write(chdir_tmp / "two" / "b.yaml", "name: b\nprompt: x\n")
    assert error_of("two") == "two: no config.yaml, and several root files look like agents (a.yaml, b.yaml)"
    write(chdir_tmp / "none" / "a.yaml", "x: 1\n")
    write(chdir_tmp / "none" / "b.yaml", "y: 1\n")
    assert error_of("none") == "none: no config.yaml, and none of a.yaml, b.yaml has 'name' and 'prompt'"


# --- bundles ----------------------------------------------------------------


def test_yaml_bundle_has_bare_filename_at_root(tmp_path):
    p = write(tmp_path / "hello_world.yaml", BASIC)
    data = bundle_bytes(p)
    assert data[:2] == b"\x1f\x8b"
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        assert tar.getnames() == ["hello_world.yaml"]
        assert tar.extractfile("hello_world.yaml").read() == BASIC.encode()


def test_yaml_bundle_round_trip(tmp_path):
    p = write(tmp_path / "hello_world.yaml", BASIC + "description: '1.0'\nreasoning_effort: 'yes'\n")
    spec = load_spec(p)
    back = spec_from_bundle(bundle_bytes(p))
    assert back == spec
    assert back.source == "bundle/hello_world.yaml"
    assert back.to_dict() == spec.to_dict()


def test_directory_bundle_round_trip(tmp_path):
    d = tmp_path / "agent"
    write(d / "config.yaml", BASIC)
    write(d / "tools" / "mcp" / "x.yaml", "a: 1\n")
    data = bundle_bytes(d)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        names = tar.getnames()
        assert {"config.yaml", "tools", "tools/mcp", "tools/mcp/x.yaml"} == set(names)
        assert all(not n.startswith(("./", "/")) for n in names)
        assert {m.uname for m in tar.getmembers()} == {""}
    assert spec_from_bundle(data, name_hint="up") == load_spec(d)


def test_tar_gz_path_is_returned_unchanged_and_loadable(tmp_path):
    src = write(tmp_path / "a.yaml", BASIC)
    tgz = tmp_path / "agent.tar.gz"
    tgz.write_bytes(bundle_bytes(src))
    assert bundle_bytes(tgz) == tgz.read_bytes()
    spec = load_spec(tgz, model="mock-model")
    assert spec.model == "mock-model"
    assert spec.source == f"{tgz}/a.yaml"
    assert spec == load_spec(src, model="mock-model")


def test_tar_gz_override_matches_yaml_override(tmp_path):
    # defaults are decided after overrides, whatever the container
    src = write(tmp_path / "a.yaml", "name: a\nprompt: x\n")
    tgz = tmp_path / "a.tgz"
    tgz.write_bytes(bundle_bytes(src))
    assert load_spec(tgz, harness="openai-chat", model="m") == load_spec(src, harness="openai-chat", model="m")
    assert load_spec(tgz, model="m").harness == DEFAULT_HARNESS
    for path in (src, tgz):
        with pytest.raises(SpecError, match="'executor.model' is missing"):
            load_spec(path, harness="openai-chat")


def test_bundle_from_spec_round_trip(tmp_path):
    p = write(
        tmp_path / "a.yaml",
        "name: a\ninstructions: |\n  two\n  lines  \n\n\ndescription: '2024-01-01'\n"
        "executor:\n  auth: {api_key: '${K}'}\n  reasoning_effort: 'yes'\n",
    )
    spec = load_spec(p, model="m", harness="openai-chat", system_prompt="  tricky\n\tprompt\n\n")
    data = bundle_from_spec(spec)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        assert tar.getnames() == ["agent.yaml"]
    back = spec_from_bundle(data)
    assert back.to_dict() == spec.to_dict()
    assert back == spec
    assert back.source == "bundle/agent.yaml"
    assert bundle_from_spec(spec) == data  # deterministic


def test_bundle_from_spec_applies_overrides(tmp_path):
    p = write(tmp_path / "a.yaml", BASIC)
    spec = load_spec(p, model="mock-model", harness="openai-agents")
    back = spec_from_bundle(bundle_from_spec(spec))
    assert (back.model, back.harness) == ("mock-model", "openai-agents")


def test_bundle_accepts_dot_slash_and_plain_tar():
    yaml_text = BASIC.encode()
    assert spec_from_bundle(tar_gz({"./config.yaml": yaml_text})).name == "hello_world"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("config.yaml")
        info.size = len(yaml_text)
        tar.addfile(info, io.BytesIO(yaml_text))
    assert spec_from_bundle(buf.getvalue()).name == "hello_world"


def test_bundle_picks_agent_yaml_among_root_files():
    data = tar_gz({"notes.yaml": b"x: 1\n", "agent.yml": BASIC.encode(), "sub/other.yaml": b"name: o\nprompt: p\n"})
    assert spec_from_bundle(data).name == "hello_world"


@pytest.mark.parametrize(
    ("members", "links", "expected"),
    [
        ({"../evil.yaml": b"x"}, None, "up: unsafe path in bundle: '../evil.yaml'"),
        ({"a/../../evil": b"x"}, None, "up: unsafe path in bundle: 'a/../../evil'"),
        ({"/etc/evil.yaml": b"x"}, None, "up: unsafe path in bundle: '/etc/evil.yaml'"),
        ({"config.yaml": BASIC.encode()}, {"link": "../../etc/passwd"}, "up: unsafe path in bundle: '../../etc/passwd'"),
        ({"config.yaml": BASIC.encode()}, {"link": "/etc/passwd"}, "up: unsafe path in bundle: '/etc/passwd'"),
    ],
)
def test_bundle_path_traversal_rejected(members, links, expected):
    with pytest.raises(SpecError) as info:
        spec_from_bundle(tar_gz(members, links=links), name_hint="up")
    assert str(info.value) == expected


def test_bundle_never_touches_disk(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec_from_bundle(tar_gz({"config.yaml": BASIC.encode(), "data/f.txt": b"x"}))
    assert list(tmp_path.iterdir()) == []


def test_bundle_errors():
    with pytest.raises(SpecError, match=r"^b: not a valid \.tar\.gz bundle \("):
        spec_from_bundle(b"not a tarball", name_hint="b")
    with pytest.raises(SpecError, match=r"^b: not a valid \.tar\.gz bundle \("):
        spec_from_bundle(tar_gz({"config.yaml": BASIC.encode()})[:40], name_hint="b")
    with pytest.raises(SpecError, match=r"^b: no config\.yaml and no \.yaml/\.yml file at its root$"):
        spec_from_bundle(tar_gz({"readme.md": b"hi"}), name_hint="b")
    with pytest.raises(SpecError, match=r"^b/config\.yaml: 'name' is missing$"):
        spec_from_bundle(tar_gz({"config.yaml": b"prompt: x\n"}), name_hint="b")


def test_bundle_size_cap():
    big = tar_gz({"config.yaml": BASIC.encode(), "big.bin": b"\0" * (17 * 1024 * 1024)})
    assert len(big) < 1024 * 1024  # small compressed, big unpacked
    with pytest.raises(SpecError) as info:
        spec_from_bundle(big, name_hint="b")
    assert str(info.value) == "b: bundle too large (over 16 MiB unpacked)"
    with pytest.raises(SpecError, match=r"^b: bundle too large \(over 16 MiB\)$"):
        spec_from_bundle(b"\0" * (16 * 1024 * 1024 + 1), name_hint="b")


# --- dict form --------------------------------------------------------------


def test_to_dict_from_dict(tmp_path):
    p = write(tmp_path / "a.yaml", AUTH_YAML + "description: 2024-01-01\n")
    spec = load_spec(p, model="mock-model")
    d = spec.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert set(d) == {"name", "instructions", "harness", "model", "auth", "reasoning_effort", "raw",
                      "tools", "permissions", "max_steps", "tool_timeouts"}
    again = AgentSpec.from_dict(d)
    assert again == spec and again.to_dict() == d
    d["raw"]["name"] = "changed"  # a copy: the spec is not affected
    assert spec.raw["name"] == "a"


def test_from_dict_rechecks():
    with pytest.raises(SpecError, match=r"^agent spec: 'raw' is missing$"):
        AgentSpec.from_dict({"name": "a"})
    with pytest.raises(SpecError, match=r"^wire: executor\.harness: unknown harness 'x'"):
        AgentSpec.from_dict({"raw": {"name": "a", "prompt": "p", "executor": {"harness": "x"}}}, source="wire")


def test_spec_is_frozen_and_hashable(tmp_path):
    spec = load_spec(write(tmp_path / "a.yaml", BASIC))
    with pytest.raises(AttributeError):
        spec.name = "b"
    assert hash(spec) == hash(load_spec(tmp_path / "a.yaml"))


# --- credentials ------------------------------------------------------------

AUTH_YAML = """\
name: a
prompt: x
executor:
  model: m
  auth:
    type: api_key
    api_key: ${MY_KEY}
    base_url: http://${MY_HOST}/v1
"""


def test_auth_kept_as_written(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_KEY", "sk-secret-from-env")
    monkeypatch.setenv("MY_HOST", "llm.local")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-from-env")
    spec = load_spec(write(tmp_path / "a.yaml", AUTH_YAML))
    assert spec.auth == {"type": "api_key", "api_key": "${MY_KEY}", "base_url": "http://${MY_HOST}/v1"}
    blobs = [json.dumps(spec.to_dict()).encode()]
    for data in (bundle_from_spec(spec), bundle_bytes(tmp_path / "a.yaml")):
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            blobs += [tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()]
    for blob in blobs:
        assert b"${MY_KEY}" in blob
        assert b"sk-secret-from-env" not in blob
        assert b"sk-openai-from-env" not in blob
        assert b"llm.local" not in blob


def test_no_auth_injected_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-from-env")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://mock/v1")
    spec = load_spec(write(tmp_path / "a.yaml", BASIC))
    assert spec.auth is None and "auth" not in spec.raw["executor"]
    assert b"sk-openai" not in json.dumps(spec.to_dict()).encode()


def test_resolve_auth_precedence(tmp_path):
    spec = load_spec(write(tmp_path / "a.yaml", AUTH_YAML))
    env = {"MY_KEY": "k1", "MY_HOST": "h", "OPENAI_API_KEY": "k2", "OPENAI_BASE_URL": "http://b2"}
    assert resolve_auth(spec, env) == {"api_key": "k1", "base_url": "http://h/v1"}

    partial = load_spec(write(tmp_path / "b.yaml", "name: b\nprompt: x\nexecutor: {model: m, auth: {type: api_key}}\n"))
    assert resolve_auth(partial, env) == {"api_key": "k2", "base_url": "http://b2"}

    bare = load_spec(write(tmp_path / "c.yaml", BASIC))
    assert resolve_auth(bare, env) == {"api_key": "k2", "base_url": "http://b2"}
    assert resolve_auth(bare, {}) == {"api_key": None, "base_url": None}

    literal = load_spec(write(tmp_path / "d.yaml", "name: d\nprompt: x\nexecutor: {model: m, auth: {api_key: 'sk-$NOT_EXPANDED'}}\n"))
    assert resolve_auth(literal, env) == {"api_key": "sk-$NOT_EXPANDED", "base_url": "http://b2"}

    empty = load_spec(write(tmp_path / "e.yaml", "name: e\nprompt: x\nexecutor: {model: m, auth: {api_key: '${EMPTY}'}}\n"))
    assert resolve_auth(empty, {"EMPTY": "", "OPENAI_API_KEY": "k2"})["api_key"] == "k2"


def test_resolve_auth_defaults_to_os_environ(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_KEY", "from-os")
    monkeypatch.setenv("MY_HOST", "h")
    spec = load_spec(write(tmp_path / "a.yaml", AUTH_YAML))
    assert resolve_auth(spec)["api_key"] == "from-os"


def test_resolve_auth_missing_variable(chdir_tmp):
    write(chdir_tmp / "agents" / "a.yaml", AUTH_YAML)
    spec = load_spec("agents/a.yaml")  # loading does not need the variable
    with pytest.raises(SpecError) as info:
        resolve_auth(spec, {"MY_HOST": "h", "OPENAI_API_KEY": "k"})
    assert str(info.value) == "agents/a.yaml: executor.auth.api_key: environment variable 'MY_KEY' is not set"
    wire = AgentSpec.from_dict(spec.to_dict(), source="agent 'a'")
    with pytest.raises(SpecError, match=r"^agent 'a': executor\.auth\.base_url: environment variable 'MY_HOST'"):
        resolve_auth(wire, {"MY_KEY": "k"})
