"""The config file as a user meets it: a bare `omnigent run`, the model ladder, the seeds' files, the surface."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import configure_mock_llm, mock_requests

RUN_TIMEOUT = 60


@pytest.fixture
def env(mock_credentials_env, tmp_path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    env = {**mock_credentials_env, "HOME": str(home)}
    env["OMNIGENT_CONFIG_HOME"] = str(home / ".omnigent")  # as seed S1 sets it
    for var in ("OMNIGENT_MODEL", "OMNIGENT_HARNESS", "OMNIGENT_LOG_LEVEL"):
        env.pop(var, None)
    return env


def omnigent(env: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "omnigent", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT, stdin=subprocess.DEVNULL)


def test_a_bare_run_uses_the_config_and_the_ladder_holds(env, mock_llm_server_url, tmp_path):
    """default_agent + the config's model (the agent names none), then OMNIGENT_MODEL over it, then --model."""
    tag = uuid.uuid4().hex[:8]
    models = {rung: f"{rung}-{tag}" for rung in ("config", "env", "flag")}
    for rung, model in models.items():
        configure_mock_llm(mock_llm_server_url, [{"text": f"ANSWER_FROM_{rung.upper()}"}], key=model)
    agent = tmp_path / "agent.yaml"
    agent.write_text("name: configured\nprompt: Be brief.\n")  # no executor: model and harness from the config
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    config = Path(env["OMNIGENT_CONFIG_HOME"]) / "config.yaml"
    config.parent.mkdir()
    config.write_text("# Omnigent user configuration\ntui:\n  theme: light\nauth:\n  type: api_key\n")
    for key, value in (("default_agent", str(agent)), ("model", models["config"]), ("harness", "openai-chat")):
        result = omnigent(env, "config", "set", key, value)
        assert result.returncode == 0, result.stderr
    assert "tui:" in config.read_text()

    first = omnigent(env, "-v", "run", "-p", "hi", "--no-log", cwd=cwd)
    assert (first.returncode, first.stdout) == (0, "ANSWER_FROM_CONFIG\n"), first.stderr
    assert f"{config}: ignoring unknown section: tui" in first.stderr  # one line, with -v only
    [call] = mock_requests(mock_llm_server_url, key=models["config"])
    assert "messages" in call  # the config's harness: Chat Completions

    second = omnigent({**env, "OMNIGENT_MODEL": models["env"]}, "run", "-p", "hi", cwd=cwd)
    assert (second.returncode, second.stdout) == (0, "ANSWER_FROM_ENV\n"), second.stderr
    assert "warning" not in second.stderr  # no -v: silent

    third = omnigent({**env, "OMNIGENT_MODEL": models["env"]}, "run", "-p", "hi", "--model", models["flag"], cwd=cwd)
    assert (third.returncode, third.stdout) == (0, "ANSWER_FROM_FLAG\n"), third.stderr


def test_the_surface(env, tmp_path):
    bare = omnigent(env)
    assert bare.returncode == 0 and bare.stdout.startswith("Usage: omnigent")
    version = omnigent(env, "--version")
    assert version.returncode == 0 and version.stdout.startswith("omnigent 0.")
    broken = Path(env["OMNIGENT_CONFIG_HOME"]) / "config.yaml"
    broken.parent.mkdir()
    broken.write_text("model: [unclosed\n")
    result = omnigent(env, "run", "-p", "hi")
    assert result.returncode == 1 and result.stderr.startswith(f"Error: {broken}: not valid YAML")
    assert result.stderr.count("\n") == 1
