"""A runner whose parent dies exits at once in every state (issue 7 §9), with real processes.

The parent's death shows as EOF on the runner's stdin. Before, the runner
watched stdin only after importing openai, which takes seconds under load.
Here the import is made to hang (a stand-in `openai` package that sleeps on
import, first on PYTHONPATH): the runner must still stop on stdin EOF or
SIGTERM, which it can only do if it watches them while importing. How fast
each state exits is measured by scripts/bench_runner_exit.py, not asserted.
"""

from __future__ import annotations

import signal
from pathlib import Path

import trio

from tests.integration.test_runner_process import (  # noqa: F401  (fixtures)
    ROOT,
    WAIT,
    configure,
    llm,
    make_turn,
    online,
    server,
    spawn,
)


def hanging_openai(tmp_path: Path) -> dict[str, str]:
    pkg = tmp_path / "slow" / "openai"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("import time\ntime.sleep(600)\n")
    return {"PYTHONPATH": f"{pkg.parent}:{ROOT}"}


async def until_logged(log: Path, text: str) -> None:
    with trio.fail_after(WAIT):
        while text not in (log.read_text() if log.exists() else ""):
            await trio.sleep(0.02)


async def test_stdin_eof_while_openai_is_still_importing_exits_0(spawn, server, tmp_path):
    runner = await spawn(server.url, env=hanging_openai(tmp_path))
    await until_logged(runner.log, "started pid")
    await trio.sleep(0.2)  # well inside the (endless) import
    await runner.close_stdin()
    assert await runner.wait() == 0
    log = runner.log.read_text()
    assert "stopping: stdin closed" in log and "online as" not in log


async def test_sigterm_while_openai_is_still_importing_exits_0(spawn, server, tmp_path):
    runner = await spawn(server.url, env=hanging_openai(tmp_path))
    await until_logged(runner.log, "started pid")
    runner.proc.send_signal(signal.SIGTERM)
    assert await runner.wait() == 0
    assert "stopping: SIGTERM" in runner.log.read_text()


async def test_stdin_eof_mid_turn_exits_0(spawn, server, llm):
    _, http = llm
    await configure(http, [{"block": True, "text": "never"}])
    runner, conn = await online(spawn, server)
    await conn.send(make_turn())
    with trio.fail_after(WAIT):  # the model call is parked in the mock
        while not (await http.get("/gate/pending")).json()["count"]:
            await trio.sleep(0.02)
    await runner.close_stdin()
    assert await runner.wait() == 0
    assert "stopping: stdin closed" in runner.log.read_text()


async def test_stdin_eof_right_at_start_exits_0(spawn, server):
    runner = await spawn(server.url)
    await runner.close_stdin()  # before the interpreter even got to trio
    assert await runner.wait() == 0
