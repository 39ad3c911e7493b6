"""The config file: where it is, what it may say, how it is rewritten, and the precedence ladders."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from omnigent.agents import HARNESSES, SpecError, load_spec
from omnigent.agents.load import pick
from omnigent.cli import cli
from omnigent.config import file as cfgfile
from omnigent.config.file import Config, ConfigError, config_path, is_secret, load_config, set_value
from omnigent.config.logs import log_level
from omnigent.launch import permission_plan
from omnigent.tools.policy import MODES

# What the seed harnesses write (tests/conftest.py, tests/e2e/_pexpect_harness.py).
SEED_AUTH = "auth:\n  type: api_key\n"
SEED_THEME = "# Omnigent user configuration\ntui:\n  theme: light\n"


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("OMNIGENT_CONFIG_HOME", raising=False)
    for var in ("OMNIGENT_MODEL", "OMNIGENT_HARNESS", "OMNIGENT_LOG_LEVEL"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def write(home: Path, text: str) -> Path:
    path = home / ".omnigent" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- where it is and what it may say ---------------------------------------------------------


def test_the_file_is_under_config_home_else_home(home, monkeypatch):
    assert config_path() == home / ".omnigent" / "config.yaml"
    monkeypatch.setenv("OMNIGENT_CONFIG_HOME", str(home / "elsewhere"))
    assert config_path() == home / "elsewhere" / "config.yaml"


def test_a_missing_or_empty_file_is_an_empty_config(home):
    assert load_config() == Config(path=home / ".omnigent" / "config.yaml")
    write(home, "# nothing yet\n")
    assert load_config().model is None


def test_the_lists_agree_with_the_layers_above():
    # this layer may not import them; the lists must stay the same
    assert cfgfile.HARNESSES == HARNESSES
    assert set(cfgfile.PERMISSIONS) == set(MODES)


@pytest.mark.parametrize("text", [SEED_AUTH, SEED_THEME, SEED_THEME + SEED_AUTH])
def test_the_seeds_files_are_harmless(home, text):
    write(home, text)
    warnings: list[str] = []
    cfg = load_config(warn=warnings.append)
    assert [cfg.get(k) for k in cfgfile.KEYS] == [None] * len(cfgfile.KEYS)
    assert cfg.auth_fallback({"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "http://b/v1"}) == {}
    assert cfg.auth_fallback({}) == {}  # no api_key: nothing is filled in either
    assert len(warnings) == ("tui" in text)


def test_unknown_sections_are_one_warning_line(home):
    path = write(home, "tui: {theme: light}\nhost: {id: h1}\nmodel: m\n")
    warnings: list[str] = []
    assert load_config(warn=warnings.append).model == "m"
    assert warnings == [f"{path}: ignoring unknown sections: tui, host"]
    assert load_config().model == "m"  # without a warn callback: silent


def test_known_keys_are_read_and_checked(home):
    write(home, "model: gpt-x\nharness: openai-chat\npermissions: deny\nserver: http://h:1/\n"
                "default_agent: agents/a.yaml\n")
    cfg = load_config()
    assert (cfg.model, cfg.harness, cfg.permissions, cfg.server) == ("gpt-x", "openai-chat", "deny", "http://h:1")
    assert cfg.default_agent == str(home / ".omnigent" / "agents" / "a.yaml")  # relative to the file


@pytest.mark.parametrize(("text", "problem"), [
    ("model: [1]\n", "model: must be a string, got a list"),
    ("harness: codex\n", "harness: unknown harness 'codex' (known: openai-agents, openai-chat)"),
    ("permissions: yolo\n", "permissions: unknown mode 'yolo' (known: deny, ask, auto)"),
    ("server: localhost:8000\n", "server: expected an http(s)://HOST[:PORT] URL, not 'localhost:8000'"),
    ("model: ''\n", "model: must not be empty"),
    ("auth: yes\n", "auth: must be a mapping, got a boolean"),
    ("- model\n", "the top level must be a mapping of settings, got a list"),
    ("model: [\n", "not valid YAML"),
])
def test_a_malformed_file_is_one_line_naming_it(home, text, problem):
    path = write(home, text)
    with pytest.raises(ConfigError) as info:
        load_config()
    assert str(info.value).startswith(f"{path}: {problem}")
    assert "\n" not in str(info.value)


def test_auth_with_a_key_fills_in_only_what_the_environment_lacks(home):
    write(home, "auth:\n  type: api_key\n  api_key: ${MY_KEY}\n  base_url: http://cfg/v1\n")
    cfg = load_config()
    assert cfg.auth_fallback({"MY_KEY": "k1"}) == {"OPENAI_API_KEY": "k1", "OPENAI_BASE_URL": "http://cfg/v1"}
    assert cfg.auth_fallback({"MY_KEY": "k1", "OPENAI_BASE_URL": "http://env/v1"}) == {"OPENAI_API_KEY": "k1"}
    assert cfg.auth_fallback({"MY_KEY": "k1", "OPENAI_API_KEY": "env"}) == {}  # never over the environment
    assert cfg.auth_fallback({}) == {}  # ${MY_KEY} not set: the block counts as absent


def test_secrets_are_recognised():
    assert all(is_secret(k) for k in ("auth.api_key", "api_key", "auth", "token", "OPENAI_API_KEY", "secret"))
    assert not any(is_secret(k) for k in cfgfile.KEYS)


# --- rewriting it ----------------------------------------------------------------------------


def test_set_keeps_everything_else_and_is_private(home):
    path = write(home, SEED_THEME + SEED_AUTH + "model: old\n# trailing comment\n")
    os.chmod(path, 0o644)
    os.chmod(path.parent, 0o755)
    set_value(path, "model", "new")
    set_value(path, "harness", "openai-chat")
    assert path.read_text() == SEED_THEME + SEED_AUTH + "model: new\n# trailing comment\nharness: openai-chat\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert os.listdir(path.parent) == ["config.yaml"]  # no temporary file left
    set_value(path, "model", None)
    assert load_config().model is None and "tui:" in path.read_text()


def test_set_replaces_a_multi_line_value_and_creates_the_file(home):
    path = home / ".omnigent" / "config.yaml"
    set_value(path, "model", "m1")
    assert path.read_text() == "model: m1\n"
    path.write_text("model: >\n  folded\n  text\n\ntui: {theme: dark}\n")
    set_value(path, "model", "m2: with colon")
    assert load_config().model == "m2: with colon"
    assert load_config().raw["tui"] == {"theme": "dark"}


def test_set_refuses_a_broken_file(home):
    path = write(home, "model: [\n")
    with pytest.raises(ConfigError):
        set_value(path, "model", "x")
    assert path.read_text() == "model: [\n"


# --- the precedence ladders ------------------------------------------------------------------


@pytest.mark.parametrize(("flag", "env", "agent", "config", "expected"), [
    ("f", "e", "a", "c", ("f", "flag")),
    (None, "e", "a", "c", ("e", "env")),
    (None, "", "a", "c", ("a", "agent")),  # an empty variable is not set
    (None, None, "a", "c", ("a", "agent")),
    (None, None, None, "c", ("c", "config")),
    (None, None, None, None, (None, "unset")),
])
@pytest.mark.parametrize("key", ["model", "harness"])
def test_pick_every_rung(key, flag, env, agent, config, expected):
    environ = {} if env is None else {f"OMNIGENT_{key.upper()}": env}
    assert pick(key, flag=flag, environ=environ, agent=agent, config=config) == expected


AGENT_WITH = "name: a\nprompt: p\nexecutor:\n  harness: openai-agents\n  model: from-agent\n"
AGENT_WITHOUT = "name: a\nprompt: p\n"


@pytest.mark.parametrize(("yaml_text", "flag", "environ", "defaults", "model", "harness"), [
    (AGENT_WITH, "from-flag", {"OMNIGENT_MODEL": "from-env"}, {"model": "from-config"}, "from-flag", "openai-agents"),
    (AGENT_WITH, None, {"OMNIGENT_MODEL": "from-env", "OMNIGENT_HARNESS": "openai-chat"},
     {"model": "from-config", "harness": "openai-agents"}, "from-env", "openai-chat"),
    (AGENT_WITH, None, {}, {"model": "from-config", "harness": "openai-chat"}, "from-agent", "openai-agents"),
    (AGENT_WITHOUT, None, {}, {"model": "from-config", "harness": "openai-chat"}, "from-config", "openai-chat"),
    (AGENT_WITHOUT, None, {}, {"model": "from-config"}, "from-config", "openai-agents"),
])
def test_load_spec_applies_the_ladder(tmp_path, yaml_text, flag, environ, defaults, model, harness):
    path = tmp_path / "a.yaml"
    path.write_text(yaml_text)
    spec = load_spec(path, model=flag, environ=environ, defaults=defaults)
    assert (spec.model, spec.harness) == (model, harness)
    assert spec.raw["executor"]["model"] == model  # what the bundle carries


def test_load_spec_without_a_model_anywhere_still_says_so(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text(AGENT_WITHOUT)
    with pytest.raises(SpecError, match="'executor.model' is missing"):
        load_spec(path, environ={}, defaults={})


def test_a_bad_harness_from_the_environment_is_named_as_the_variable(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text(AGENT_WITH)
    with pytest.raises(SpecError) as info:
        load_spec(path, environ={"OMNIGENT_HARNESS": "codex"})
    assert str(info.value) == f"{path}: OMNIGENT_HARNESS: unknown harness 'codex' (known: openai-agents, openai-chat)"


@pytest.mark.parametrize(("flag", "spec", "ceiling", "remote", "expected"), [
    (None, "auto", None, False, (None, None)),      # no ceiling: as before, the session decides
    ("auto", "ask", None, False, ("auto", "auto")),
    (None, "auto", "ask", False, (None, "ask")),     # the ceiling is the local host's policy
    ("auto", "auto", "ask", False, ("auto", "ask")),
    ("deny", "auto", "ask", False, ("deny", "deny")),  # the flag may be stricter than the ceiling
    (None, "auto", "ask", True, ("ask", None)),      # remote: the ceiling goes into the session's mode
    (None, "deny", "auto", True, ("deny", None)),    # a ceiling never loosens the agent's own mode
    ("auto", "deny", "ask", True, ("ask", None)),
])
def test_permission_plan(flag, spec, ceiling, remote, expected):
    assert permission_plan(flag, spec, ceiling, remote=remote) == expected


def test_the_effective_mode_never_exceeds_the_ceiling():
    from omnigent.server.approval_waits import effective_mode

    for flag in (None, *MODES):
        for spec in MODES:
            for ceiling in MODES:
                for remote in (False, True):
                    session, host = permission_plan(flag, spec, ceiling, remote=remote)
                    mode = effective_mode(session, spec, host)
                    assert MODES.index(mode) <= MODES.index(ceiling), (flag, spec, ceiling, remote)


# --- log level and the CLI's surface ---------------------------------------------------------


def test_log_level():
    assert log_level({}) == logging.INFO
    assert log_level({"OMNIGENT_LOG_LEVEL": "debug"}) == logging.DEBUG
    assert log_level({"OMNIGENT_LOG_LEVEL": "15"}) == 15
    with pytest.raises(ValueError, match="OMNIGENT_LOG_LEVEL must be one of"):
        log_level({"OMNIGENT_LOG_LEVEL": "loud"})


def invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def test_config_commands(home):
    path = home / ".omnigent" / "config.yaml"
    assert invoke("config", "set", "model", "gpt-x").exit_code == 0
    assert invoke("config", "get", "model").output == "gpt-x\n"
    missing = invoke("config", "get", "server")
    assert missing.exit_code == 1 and missing.output == "server: not set: each run starts its own local server\n"
    listed = invoke("config", "list").output.splitlines()
    assert listed[0].split(None, 2) == ["model", "gpt-x", f"config file ({path})"]
    env = invoke("config", "list", env={"OMNIGENT_MODEL": "from-env"}).output.splitlines()
    assert env[0].split(None, 2) == ["model", "from-env", "environment (OMNIGENT_MODEL; beats agent files)"]
    assert [line.split()[0] for line in listed] == list(cfgfile.KEYS)
    assert invoke("config", "unset", "model").exit_code == 0
    assert load_config().model is None
    assert invoke("config", "path").output == f"{path}\n"


@pytest.mark.parametrize(("args", "error"), [
    (("harness", "codex"), "Error: harness: unknown harness 'codex' (known: openai-agents, openai-chat)"),
    (("permissions", "yolo"), "Error: permissions: unknown mode 'yolo' (known: deny, ask, auto)"),
    (("modle", "x"), "Error: unknown config key 'modle' (did you mean 'model'? known: model, harness, "
                     "permissions, default_agent, server)"),
    (("auth.api_key", "sk-1"), "Error: auth.api_key: credentials are not kept in the config file; set "
                               "OPENAI_API_KEY (and OPENAI_BASE_URL) in the environment, or name a variable "
                               "in the agent's executor.auth"),
    (("default_agent", "nowhere.yaml"), "Error: default_agent: "),
])
def test_config_set_refuses(home, args, error):
    result = invoke("config", "set", *args)
    assert result.exit_code == 1 and result.output.startswith(error) and result.output.count("\n") == 1
    assert not (home / ".omnigent" / "config.yaml").exists()


def test_config_set_default_agent_is_stored_absolute(home, monkeypatch):
    monkeypatch.chdir(home)
    (home / "a.yaml").write_text(AGENT_WITH)
    assert invoke("config", "set", "default_agent", "a.yaml").exit_code == 0
    assert load_config().default_agent == str(home / "a.yaml")


def test_bare_omnigent_prints_help_and_succeeds(home):
    result = invoke()
    assert result.exit_code == 0 and result.output.startswith("Usage: ")
    assert invoke("-v").exit_code == 0


def test_version(home):
    result = invoke("--version")
    assert result.exit_code == 0 and result.output.startswith("omnigent ") and result.output.count("\n") == 1


def test_run_help_names_the_endpoint_variables_and_hides_log(home):
    text = invoke("run", "--help").output
    assert "OPENAI_BASE_URL" in text and "OPENAI_API_KEY" in text
    assert "--log" not in text and "--verbose" in text


def test_run_without_agent_or_default_says_how_to_set_one(home):
    result = invoke("run", "-p", "hi", "--no-log")
    assert result.exit_code == 1
    assert result.output == ("Error: no AGENT given and no default agent configured: name an agent file, "
                             "or set one with `omnigent config set default_agent PATH`\n")


def test_a_malformed_config_stops_run_in_one_line(home):
    path = write(home, "harness: codex\n")
    result = invoke("run", "-p", "hi")
    assert result.exit_code == 1
    assert result.output == f"Error: {path}: harness: unknown harness 'codex' (known: openai-agents, openai-chat)\n"


def test_a_bad_log_level_is_one_line(home):
    result = invoke("run", "-p", "hi", env={"OMNIGENT_LOG_LEVEL": "loud"})
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert result.output.startswith("Error: OMNIGENT_LOG_LEVEL must be one of")
