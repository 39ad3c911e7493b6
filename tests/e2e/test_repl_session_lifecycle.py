"""E2E coverage for the sessions-API REPL lifecycle (port of the original's S2, first test).

A real ``omnigent run --no-session`` under pexpect with a real PTY, against the
mock LLM: session creation on the first turn, runner binding, rendering,
``/history``, ``/switch``, ``/switch 1`` and Ctrl-D. The ``--server`` tests of
the seed belong to later work and are not ported here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pexpect

from tests.conftest import configure_mock_llm
from tests.e2e._pexpect_harness import (
    PROMPT_READY,
    STATE_SLEEPING,
    clean_exit,
    ensure_repl_test_theme_env,
    submit_prompt,
)

_MODEL = "mock-session-lifecycle"
_HARNESS = "openai-agents"
_LOCAL_REMOTE_AUTH_TOKEN = "local-e2e-runner-token"
_READY_TIMEOUT = 90.0
_TURN_TIMEOUT = 240.0
_EXIT_TIMEOUT = 20.0


@dataclass(frozen=True)
class _LifecycleResult:
    """
    Captured identifiers from a sessions-API REPL turn.

    :param session_id: Created or resumed session id, e.g. ``"conv_abc123"``.
    :param runner_id: Runner id bound by the turn, e.g. ``"runner_abc123"``.
    """

    session_id: str
    runner_id: str


def _write_marker_agent(tmp_path: Path, name: str, marker: str) -> Path:
    """
    Write a minimal agent YAML that replies with a fixed marker.

    :param tmp_path: Per-test temp directory.
    :param name: Agent name, e.g. ``"session_lifecycle"``.
    :param marker: Literal response marker expected in the REPL.
    :returns: Path to the generated YAML.
    """
    yaml_path = tmp_path / f"{name}.yaml"
    yaml_path.write_text(
        f"name: {name}\n"
        "executor:\n"
        f"  harness: {_HARNESS}\n"
        f"  model: {_MODEL}\n"
        "prompt: |\n"
        f"  Reply with exactly the literal string {marker} and nothing else.\n",
    )
    return yaml_path


def _repl_env(
    base_env: dict[str, str],
    home: Path,
    mock_llm_server_url: str,
) -> dict[str, str]:
    """
    Build a subprocess environment for REPL lifecycle tests.

    :param base_env: Fixture-provided mock credentials environment.
    :param home: Isolated HOME for persistent session files.
    :param mock_llm_server_url: Mock server base URL.
    :returns: Environment dict for ``pexpect.spawn``.
    """
    env = dict(base_env)
    env["HOME"] = str(home)
    env["TERM"] = "xterm-256color"
    env["LINES"] = "40"
    env["COLUMNS"] = "120"
    env["PROMPT_TOOLKIT_NO_CPR"] = "1"
    env["OMNIGENT_SESSIONS_ADAPTER_DEBUG"] = "1"
    env["OMNIGENT_REMOTE_AUTH_TOKEN"] = _LOCAL_REMOTE_AUTH_TOKEN
    env["OPENAI_BASE_URL"] = f"{mock_llm_server_url}/v1"
    env["OPENAI_API_KEY"] = "mock-key"
    return ensure_repl_test_theme_env(env)


def _spawn_run(
    omnigent_python: Path,
    repo_root: Path,
    yaml_path: Path,
    env: dict[str, str],
    *,
    session_id: str | None = None,
    no_session: bool = True,
) -> pexpect.spawn:
    """
    Spawn ``omnigent run`` under a real PTY.

    :param omnigent_python: Python interpreter with Omnigent installed.
    :param repo_root: Checkout root used as subprocess cwd.
    :param yaml_path: Agent YAML path.
    :param env: Subprocess environment.
    :param session_id: Optional session id for resume.
    :param no_session: When true, pass ``--no-session``.
    :returns: A live pexpect child.
    """
    args = ["-m", "omnigent", "run", str(yaml_path), "--model", _MODEL, "--harness", _HARNESS]
    if no_session:
        args.append("--no-session")
    if session_id is not None:
        args.extend(["--resume", session_id])
    return pexpect.spawn(
        str(omnigent_python),
        args,
        env=env,
        cwd=str(repo_root),
        encoding="utf-8",
        codec_errors="replace",
        timeout=_TURN_TIMEOUT,
        dimensions=(40, 120),
    )


def _wait_ready(child: pexpect.spawn) -> None:
    """
    Wait until the REPL is ready for input.

    :param child: Live pexpect child.
    """
    child.expect([STATE_SLEEPING, PROMPT_READY], timeout=_READY_TIMEOUT)


def _drive_turn(child: pexpect.spawn, marker: str, mock_llm_server_url: str) -> _LifecycleResult:
    """
    Configure a mock response for *marker*, submit a prompt, drive one
    turn to completion, and parse the session + runner ids that the
    sessions-adapter debug lines render during the (local-flow) turn.

    :param child: Live REPL process.
    :param marker: Literal assistant marker expected in the PTY.
    :param mock_llm_server_url: Mock server URL for configuring queues.
    :returns: Captured session and runner ids.
    """
    configure_mock_llm(mock_llm_server_url, [{"text": marker}], key=_MODEL)
    submit_prompt(child, "respond with the configured marker")

    lifecycle_branch = child.expect(
        [
            r"POST /v1/sessions multipart bundle",
            r"resuming existing session id='([^']+)'",
        ],
        timeout=60,
    )
    if lifecycle_branch == 0:
        child.expect(r"session created id='([^']+)'", timeout=60)
        session_id = str(child.match.group(1))
    else:
        session_id = str(child.match.group(1))
    marker_seen = False
    runner_id: str | None = None
    branch = child.expect(
        [
            rf"PATCH /v1/sessions/{re.escape(session_id)} runner_id='([^']+)'",
            r"runner bound id='([^']+)'",
            re.escape(marker),
        ],
        timeout=_TURN_TIMEOUT,
    )
    if branch == 0:
        requested_runner_id = str(child.match.group(1))
        child.expect(r"runner bound id='([^']+)'", timeout=60)
        runner_id = str(child.match.group(1))
        assert runner_id == requested_runner_id
    elif branch == 1:
        runner_id = str(child.match.group(1))
    else:
        marker_seen = True
    if runner_id is None:
        raise AssertionError("runner id was not rendered in the local turn")
    if not marker_seen:
        child.expect(re.escape(marker), timeout=_TURN_TIMEOUT)
    child.expect([STATE_SLEEPING, PROMPT_READY], timeout=60)
    return _LifecycleResult(session_id=session_id, runner_id=runner_id)


def test_repl_full_session_lifecycle(
    omnigent_python: Path,
    omnigent_repo_root: Path,
    mock_credentials_env: dict[str, str],
    mock_llm_server_url: str,
    tmp_path: Path,
) -> None:
    """
    REPL creates, binds, streams, and exits through ``/v1/sessions``.

    :param omnigent_python: Python interpreter fixture.
    :param omnigent_repo_root: Repository root fixture.
    :param mock_credentials_env: Mock-LLM credential environment fixture.
    :param mock_llm_server_url: Mock server URL.
    :param tmp_path: Per-test temp directory.
    """
    home = tmp_path / "home"
    yaml_path = _write_marker_agent(tmp_path, "repl_session_lifecycle", "SESSION_LIFECYCLE_OK")
    env = _repl_env(mock_credentials_env, home, mock_llm_server_url)
    child = _spawn_run(omnigent_python, omnigent_repo_root, yaml_path, env)
    try:
        _wait_ready(child)
        result = _drive_turn(child, "SESSION_LIFECYCLE_OK", mock_llm_server_url)
        assert result.session_id.startswith("conv_")
        assert result.runner_id.startswith("runner_")

        submit_prompt(child, "/history")
        child.expect(re.escape("SESSION_LIFECYCLE_OK"), timeout=20)
        child.expect([STATE_SLEEPING, PROMPT_READY], timeout=20)

        submit_prompt(child, "/switch")
        child.expect("Switch to", timeout=20)
        child.expect(re.escape(result.session_id), timeout=20)
        child.expect("/switch <#> or <id> to resume", timeout=20)
        child.expect([STATE_SLEEPING, PROMPT_READY], timeout=20)

        submit_prompt(child, "/switch 1")
        child.expect("Resumed conversation", timeout=20)
        child.expect(re.escape("SESSION_LIFECYCLE_OK"), timeout=20)
        child.expect([STATE_SLEEPING, PROMPT_READY], timeout=20)

        clean_exit(child, timeout=_EXIT_TIMEOUT)
    finally:
        child.close(force=True)
