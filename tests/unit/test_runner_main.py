"""Unit tests of the runner's configuration and import discipline (omnigent/runner/main.py).

Why: a runner is configured only through its environment, so a malformed one
must fail with a clear line and exit code 2; and the runner's startup time is
a product target, so its entry module must not drag in openai, the server or
the store (ARCHITECTURE.md: the runner never imports the server or the store).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from omnigent.runner.main import Config, ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
RUNNER_DIR = ROOT / "omnigent" / "runner"
ENV = {"OMNIGENT_SERVER_URL": "http://127.0.0.1:8123", "OMNIGENT_RUNNER_ID": "runner_" + "a" * 32,
       "OMNIGENT_RUNNER_TOKEN": "tok"}


def test_config_from_environment():
    config = load_config(ENV)
    assert config == Config("http://127.0.0.1:8123", "runner_" + "a" * 32, "tok")
    assert config.ws_url == f"ws://127.0.0.1:8123/v1/runners/runner_{'a' * 32}/ws"


@pytest.mark.parametrize(("url", "ws"), [
    ("http://127.0.0.1:1/", "ws://127.0.0.1:1/v1/runners/r/ws"),
    ("https://example.test/omni", "wss://example.test/omni/v1/runners/r/ws"),
    ("ws://[::1]:5", "ws://[::1]:5/v1/runners/r/ws"),
])
def test_ws_url(url, ws):
    assert Config(url, "r", "t").ws_url == ws


def test_missing_variables_are_all_named():
    with pytest.raises(ConfigError, match="OMNIGENT_RUNNER_ID, OMNIGENT_RUNNER_TOKEN not set"):
        load_config({"OMNIGENT_SERVER_URL": "http://x:1"})


@pytest.mark.parametrize("change", [
    {"OMNIGENT_SERVER_URL": "127.0.0.1:8123"},
    {"OMNIGENT_SERVER_URL": "ftp://host"},
    {"OMNIGENT_RUNNER_ID": "runner/../x"},
])
def test_malformed_variables(change):
    with pytest.raises(ConfigError):
        load_config({**ENV, **change})


FORBIDDEN = ("omnigent.server", "omnigent.store", "quart", "quart_trio", "hypercorn")


def test_runner_never_imports_server_store_or_web_stack():
    for path in RUNNER_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert not name.startswith(FORBIDDEN), f"{path.name} imports {name}"


def test_entry_module_imports_stay_light():
    code = ("import sys, omnigent.runner.main; "
            "print(sorted({m.split('.')[0] for m in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         timeout=30).stdout
    loaded = set(ast.literal_eval(out))
    assert not loaded & {"openai", "httpx2", "httpx", "pydantic", "quart", "hypercorn", "yaml"}
    assert {"trio", "trio_websocket", "protocol"} <= loaded


async def test_a_prewarmed_runner_freezes_its_start_up_and_collects_less_often(monkeypatch):
    """A full collection with the SDK loaded walks ~86,000 objects (~58 ms, mid-answer)."""
    import gc

    from omnigent.config.collector import THRESHOLDS
    from omnigent.runner.main import Runner

    runner = Runner(Config("http://127.0.0.1:1", "runner_" + "a" * 32, "tok"), {})
    monkeypatch.setattr(Runner, "_import_harness", lambda self: None)  # nothing to import here
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)  # CPython's default (an earlier test may have tuned them)
    gc.unfreeze()
    try:
        await runner.prewarm()
        assert gc.get_threshold() == THRESHOLDS
        assert gc.get_freeze_count() > 0
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
