"""The shell tool with a real bash: output, caps, exit codes, timeout, cancel, environment, redaction.

These run with PID namespaces turned off (`OMNIGENT_TOOL_PIDNS=0`), the path
every machine has; the namespace's own behaviour is tested at the end.
"""

from __future__ import annotations

import json
import os

import pytest
import trio

from omnigent.tools import ToolContext, run_tool, scrub_env, secret_values
from omnigent.tools.shell import PIDNS_VAR, namespace_argv

_HAS_PIDNS = bool(namespace_argv())


@pytest.fixture(autouse=True)
def _no_namespace(request, monkeypatch):
    if "in_namespace" not in request.node.name:
        monkeypatch.setenv(PIDNS_VAR, "0")

SECRETS = {
    "OMNIGENT_RUNNER_TOKEN": "runner-token-0123456789abcdef",
    "OMNIGENT_HOST_SECRET": "host-secret-0123456789",
    "OPENAI_API_KEY": "sk-test-0123456789abcdef",
    "GITHUB_TOKEN": "ghp_0123456789abcdef",
}


def context(ws, *, timeout=10.0, on_output=None, environ=None):
    environ = dict(os.environ, **SECRETS) if environ is None else environ
    return ToolContext(str(ws), timeout, scrub_env(environ), secret_values(environ), on_output=on_output)


async def shell(ws, command, **kwargs):
    ctx = context(ws, **kwargs)
    return await run_tool("shell", json.dumps({"command": command}), ctx), ctx


async def test_output_exit_code_and_cwd(tmp_path):
    out, _ = await shell(tmp_path, "pwd; echo err >&2; exit 3")
    assert out.status == "completed" and out.exit_code == 3
    assert out.output == f"{os.path.realpath(tmp_path)}\nerr\nexit code: 3"
    empty, _ = await shell(tmp_path, "true")
    assert empty.output == "(no output)\nexit code: 0"
    killed, _ = await shell(tmp_path, "kill -9 $$")
    assert killed.output.endswith("exit code: 137 (killed by SIGKILL)")


async def test_stdin_is_empty(tmp_path):
    out, _ = await shell(tmp_path, "cat; echo done")
    assert out.output == "done\nexit code: 0"


async def test_output_is_capped_head_and_tail(tmp_path):
    out, _ = await shell(tmp_path, "head -c 200000 /dev/zero | tr '\\0' a; echo; echo THE-END")
    text = out.output
    assert "[... " in text and " bytes cut ...]" in text
    assert text.startswith("a" * 1000) and text.endswith("THE-END\nexit code: 0")
    cut = int(text.split("[... ")[1].split(" bytes cut")[0])
    assert cut == 200000 + 1 + 8 - 64 * 1024
    assert len(text) < 64 * 1024 + 200


async def test_streamed_chunks_are_redacted_even_across_chunk_borders(tmp_path):
    chunks: list[str] = []

    async def on_output(text: str) -> None:
        chunks.append(text)

    secret = SECRETS["OPENAI_API_KEY"]
    command = f"printf '%s' '{secret[:5]}'; sleep 0.05; printf '%s\\n' '{secret[5:]}'; echo ok"
    out, ctx = await shell(tmp_path, command, on_output=on_output)
    streamed = "".join(chunks)
    assert secret not in streamed and "[redacted]" in streamed and "ok" in streamed
    assert secret not in out.output and "[redacted]" in out.output
    assert "".join(ctx.captured) == streamed


async def test_env_shows_no_credential(tmp_path):
    out, _ = await shell(tmp_path, "env; echo ---; cat /proc/$$/environ | tr '\\0' '\\n'; echo ---;"
                                   " cat /proc/$PPID/environ | tr '\\0' '\\n'")
    for name, value in SECRETS.items():
        assert value not in out.output
        assert f"{name}=" not in out.output
    assert "PATH=" in out.output and "HOME=" in out.output


async def test_a_secret_leaked_through_a_file_is_redacted(tmp_path):
    (tmp_path / "leak.txt").write_text(f"token={SECRETS['GITHUB_TOKEN']}\n")
    out, _ = await shell(tmp_path, "cat leak.txt")
    assert out.output == "token=[redacted]\nexit code: 0"
    read = await run_tool("read_file", json.dumps({"path": "leak.txt"}), context(tmp_path))
    assert read.output == "     1\ttoken=[redacted]"


async def test_timeout_kills_the_group_and_says_so(tmp_path):
    ctx = context(tmp_path, timeout=0.3)
    out = await run_tool("shell", json.dumps({"command": "echo started; trap '' TERM; sleep 30"}), ctx)
    assert out.status == "timeout" and out.output.startswith("started\n")
    assert "[timed out after 0.3 s: the command and everything it started were killed]" in out.output
    per_call = await run_tool("shell", json.dumps({"command": "sleep 30", "timeout_s": 0.2}), context(tmp_path))
    assert per_call.status == "timeout" and "after 0.2 s" in per_call.output


async def test_cancel_stops_the_command_and_keeps_the_output_so_far(tmp_path):
    seen = trio.Event()

    async def on_output(text: str) -> None:
        seen.set()

    ctx = context(tmp_path, on_output=on_output)
    with trio.move_on_after(5) as outer:
        async with trio.open_nursery() as nursery:
            async def run() -> None:
                await run_tool("shell", json.dumps({"command": "echo partial; exec sleep 30"}), ctx)
                pytest.fail("a cancelled tool must not return")
            nursery.start_soon(run)
            await seen.wait()
            nursery.cancel_scope.cancel()
    assert not outer.cancelled_caught
    assert "".join(ctx.captured) == "partial\n"


async def test_background_jobs_of_the_group_do_not_hold_the_call(tmp_path):
    with trio.fail_after(5):
        out, _ = await shell(tmp_path, "sleep 30 & echo started")
    assert out.output == "started\nexit code: 0"


async def test_running_tool_pids_is_the_keep_of_a_sweep(tmp_path):
    from omnigent.tools import running_tool_pids

    started = trio.Event()

    async def on_output(text: str) -> None:
        started.set()

    ctx = context(tmp_path, on_output=on_output)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_tool, "shell", json.dumps({"command": "echo go; exec sleep 30"}), ctx)
        await started.wait()
        [pid] = running_tool_pids()
        assert os.getpgid(pid) == pid  # its own group: what a sweep with keep= spares
        nursery.cancel_scope.cancel()
    assert running_tool_pids() == frozenset()


@pytest.mark.skipif(not _HAS_PIDNS, reason="no user+PID namespaces here")
async def test_in_namespace_a_setsid_grandchild_ends_with_its_command(tmp_path):
    """The namespace's init is the bash: when it exits the kernel ends all that is left, no sweep needed."""
    marker = f"300.{os.getpid()}77"
    out, _ = await shell(tmp_path, f"setsid sleep {marker} >/dev/null 2>&1 < /dev/null & echo pid=$$ ppid=$PPID")
    assert out.status == "completed" and "pid=1 ppid=0" in out.output  # init of its own namespace
    with trio.fail_after(2):
        while any(marker.encode() in _cmdline(pid) for pid in os.listdir("/proc") if pid.isdigit()):
            await trio.sleep(0.02)


@pytest.mark.skipif(not _HAS_PIDNS, reason="no user+PID namespaces here")
async def test_in_namespace_exit_codes_timeouts_and_files_behave_as_without(tmp_path):
    out, _ = await shell(tmp_path, "echo hi > f.txt; id -u; exit 4")
    assert out.exit_code == 4 and out.output.splitlines()[0] == str(os.getuid())  # the same user inside
    assert (tmp_path / "f.txt").read_text() == "hi\n" and (tmp_path / "f.txt").stat().st_uid == os.getuid()
    slow, _ = await shell(tmp_path, "sleep 30", timeout=0.3)
    assert slow.status == "timeout"


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""
