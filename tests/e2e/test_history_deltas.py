"""A long conversation in one `omnigent run`: later turns send the runner only what is new.

Why: the server keeps the runner that served a session's last step from
receiving the whole history again (runner/history_cache.py), but the model
must get exactly what it got before. The same piped REPL conversation (a
failed turn whose message is merged into the next, a read-only tool call, a
side-effecting call refused for want of a terminal, plain answers) runs with
the cache and with `OMNIGENT_HISTORY_CACHE=0`: the mock's sha256 of every
request body must be the same list, and the runner's log must show the
later steps carried only their new items. The mock's answers carry fixed ids
so that the two runs' bodies can be byte-identical.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest

from tests.conftest import configure_mock_llm
from tests.e2e._repl_helpers import RUN_TIMEOUT, agent_env, run_args

PROMPTS = [f"question {n}" for n in range(8)]


def _message(n: int) -> dict:
    return {"native_items": [{"id": f"msg_fixed{n}", "type": "message", "role": "assistant", "status": "completed",
                              "content": [{"type": "output_text", "text": f"answer {n}", "annotations": []}]}]}


def _call(n: int, name: str, arguments: str) -> dict:
    return {"native_items": [{"id": f"fc_fixed{n}", "type": "function_call", "call_id": f"call_fixed{n}",
                              "name": name, "arguments": arguments, "status": "completed"}]}


def _script() -> list[dict]:
    return [
        _message(0),
        {"error": "bad request", "status_code": 400},        # question 1 fails: merged into question 2
        _message(2),
        _call(3, "read_file", '{"path": "notes.txt"}'),       # a read-only tool runs
        _message(3),
        _call(4, "write_file", '{"path": "x.txt", "content": "x"}'),  # refused: nobody to approve it
        _message(4),
        _message(5), _message(6), _message(7),
    ]


def _conversation(python: Path, root: Path, base_env: dict, mock: str, tmp_path: Path, model: str, name: str,
                  cache: bool) -> tuple[list[str], str]:
    """The same model name both times (it is in the body): the mock's captured requests accumulate."""
    configure_mock_llm(mock, _script(), key=model)
    home = tmp_path / name
    env = agent_env(base_env, home / "home")
    if not cache:
        env["OMNIGENT_HISTORY_CACHE"] = "0"
    workspace = tmp_path / "workspace"  # the same path both times: it is in the instructions
    workspace.mkdir(exist_ok=True)
    (workspace / "notes.txt").write_text("colour: blue\n")
    agent = home / "agent.yaml"
    agent.write_text(f"name: deltas\nprompt: Be brief.\ntools: [read_file, write_file]\npermissions: ask\n"
                     f"executor:\n  model: {model}\n")
    result = subprocess.run([str(python), *run_args(agent)], env=env, cwd=str(workspace),
                            input="".join(p + "\n" for p in PROMPTS), capture_output=True, text=True,
                            timeout=RUN_TIMEOUT)
    assert "answer 7" in result.stdout, result.stderr  # exit status 1: question 1 failed
    found = httpx.get(f"{mock}/mock/requests", params={"key": model, "sha256": "1"}, timeout=10).json()
    logs = "".join(p.read_text(errors="replace") for p in (home / "home" / ".omnigent").rglob("*.log"))
    return found["sha256"], logs


@pytest.mark.slow  # out of the default run to keep it under 5 minutes; .ci/run runs it
def test_later_turns_send_deltas_and_the_model_gets_the_same_bytes(
        omnigent_python, omnigent_repo_root, mock_credentials_env, mock_llm_server_url, tmp_path):
    args = (omnigent_python, omnigent_repo_root, mock_credentials_env, mock_llm_server_url, tmp_path,
            f"mock-deltas-{uuid.uuid4().hex[:8]}")
    plain, plain_logs = _conversation(*args, "plain", cache=False)
    both, logs = _conversation(*args, "cached", cache=True)
    assert len(plain) == 10  # one model call per step: 8 turns, two of them with a tool step
    assert both[10:] == plain
    assert "from the cache" not in plain_logs
    deltas = [(int(new), int(held)) for new, held in
              re.findall(r"(\d+) new history items sent, (\d+) from the cache", logs)]
    assert len(deltas) >= 8, logs[-3000:]  # every step after the first (a rebinding would send in full)
    assert max(held for _, held in deltas) >= 14 and max(new for new, _ in deltas) <= 4
