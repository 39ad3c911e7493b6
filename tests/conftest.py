"""Fixtures shared by every test layer: the mock LLM over a real socket, a clean environment."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def configure_mock_llm(url: str, responses: list[dict], *, key: str = "default", match: str | None = None) -> None:
    body: dict = {"key": key, "responses": responses}
    if match is not None:
        body["match"] = match
    httpx.post(f"{url}/mock/configure", json=body, timeout=10).raise_for_status()


def reset_mock_llm(url: str) -> None:
    httpx.post(f"{url}/mock/reset", timeout=10).raise_for_status()


def mock_requests(url: str, key: str | None = None) -> list[dict]:
    params = {"key": key} if key else None
    return httpx.get(f"{url}/mock/requests", params=params, timeout=10).json()["requests"]


@pytest.fixture(scope="session")
def omnigent_python() -> Path:
    return Path(sys.executable)


@pytest.fixture(scope="session")
def omnigent_repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def mock_llm_server_url() -> Iterator[str]:
    """The mock LLM as a real process on a free port, shared by the session."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "omnigent.testing.mock_llm", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
        cwd=REPO_ROOT,
    )
    try:
        line = proc.stdout.readline()  # blocks until it listens (or dies: empty line)
        if "listening on " not in line:
            raise RuntimeError(f"mock LLM did not start: {line!r}")
        yield line.rsplit(" ", 1)[1].strip()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def mock_credentials_env(mock_llm_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    env = dict(os.environ)
    env["OPENAI_BASE_URL"] = f"{mock_llm_server_url}/v1"
    env["OPENAI_API_KEY"] = "mock-key"
    for name in ("ANTHROPIC_API_KEY", "DATABRICKS_TOKEN", "OMNIGENT_DATA_DIR",
                 "OMNIGENT_SESSIONS_ADAPTER_DEBUG"):
        env.pop(name, None)
    env["OMNIGENT_SKIP_ONBOARD"] = "1"
    env["OMNIGENT_NO_UPDATE_CHECK"] = "1"
    config_home = tmp_path_factory.mktemp("omnigent-config")
    (config_home / "config.yaml").write_text("auth:\n  type: api_key\n")
    env["OMNIGENT_CONFIG_HOME"] = str(config_home)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def pytest_configure(config: pytest.Config) -> None:
    """Per-test time limits that still tear fixtures down, and the asyncio tests given back to
    pytest-asyncio: tests/support/timeouts.py."""
    if not config.pluginmanager.has_plugin("tests.support.timeouts"):
        config.pluginmanager.import_plugin("tests.support.timeouts")
