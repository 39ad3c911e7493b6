"""Figures for `omnigent run AGENT --server URL` (the host daemon's runners), against the mock LLM.

Prints figures; asserts nothing. Starts the mock LLM and `omnigent server --runners 0`
on loopback, then times, as a user sees it (REPL with piped stdin, wall clock from
spawning `omnigent run` to the answer line on its stdout):

  - cold: a fresh HOME, so the daemon starts and launches the session's runner
  - warm: a new session on a running daemon (a runner is launched for it)
  - resume: `--resume ID` of a session whose runner is online (reused: nothing launched)
  - kill: SIGKILL of the session's runner (pid from the daemon log) -> the next answer,
    in one REPL, on a daemon with no other runner (the supervisor's replacement, with a
    new id, answers it)

Each as a median and as a ratio to `python -c "import openai, trio"` timed in the
same run, interleaved, so the machine's speed and load cancel out of the ratio.

Usage: python scripts/bench_server_mode.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from bench_run import import_floor, start_mock  # noqa: E402

MODEL = "bench"
MOCK_URL = ""  # set by main


def script_answer() -> str:
    """A unique answer for the next model call (a resumed REPL prints its history: old answers)."""
    import uuid

    import httpx

    marker = f"ANSWER_{uuid.uuid4().hex[:12]}"
    httpx.post(f"{MOCK_URL}/mock/configure", json={"key": MODEL, "responses": [{"text": marker}]},
               timeout=10).raise_for_status()
    return marker


def start_server(env: dict[str, str], data: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "omnigent", "server", "--runners", "0", "--data-dir", str(data)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    line = proc.stdout.readline()
    if "listening on " not in line:
        raise SystemExit(f"server did not start: {line!r}")
    return proc, line.split("listening on ")[1].split()[0]


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop_daemons(home: Path) -> None:
    subprocess.run([sys.executable, "-m", "omnigent", "host", "stop"], env={**os.environ, "HOME": str(home)},
                   capture_output=True, timeout=30)


class Repl:
    """`omnigent run AGENT --server URL` with a pipe for stdin; `ask` times one answer."""

    def __init__(self, agent: Path, url: str, env: dict[str, str], cwd: Path, *extra: str) -> None:
        self.started = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "omnigent", "run", str(agent), "--server", url, *extra],
                                     env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, bufsize=1)

    def ask(self, text: str) -> float:
        """Send `text`; the wall time from now until the answer line."""
        marker = script_answer()
        start = time.perf_counter()
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        self.wait_answer(marker)
        return time.perf_counter() - start

    def wait_answer(self, marker: str) -> None:
        for line in self.proc.stdout:
            if marker in line:
                return
        raise SystemExit(f"the REPL ended without an answer ({self.proc.wait()})")

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def first_answer(agent: Path, url: str, env: dict[str, str], cwd: Path, *extra: str) -> tuple[float, str]:
    """Start to first answer (the prompt is written at once: it waits in the pipe)."""
    marker = script_answer()
    repl = Repl(agent, url, env, cwd, *extra)
    repl.proc.stdin.write("Say hi\n")
    repl.proc.stdin.flush()
    repl.wait_answer(marker)
    wall = time.perf_counter() - repl.started
    repl.close()
    return wall, newest_session(url)


def newest_session(url: str) -> str:
    import httpx

    return httpx.get(f"{url}/v1/sessions", params={"limit": 1}, timeout=5).json()["data"][0]["id"]


def runner_pid(home: Path, runner_id: str) -> int:
    text = "".join(p.read_text() for p in (home / ".omnigent/logs/host-daemon").glob("daemon-*.log"))
    return int(re.findall(rf"Launched runner {re.escape(runner_id)}\b.*?\(pid=(\d+)\)", text)[-1])


def bound_runner(url: str, session_id: str) -> str:
    import httpx

    return httpx.get(f"{url}/v1/sessions/{session_id}", timeout=5).json()["runner_id"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="omnigent-bench-server-"))
    global MOCK_URL
    mock, mock_url = start_mock()
    MOCK_URL = mock_url
    env = {**os.environ, "OPENAI_BASE_URL": f"{mock_url}/v1", "OPENAI_API_KEY": "mock"}
    server, url = start_server(env, tmp / "server")
    agent = tmp / "agent.yaml"
    agent.write_text("name: bench_server\nexecutor: {harness: openai-agents, model: bench}\nprompt: hi\n")
    figures: dict[str, list[float]] = {"cold": [], "warm": [], "resume": [], "kill": []}
    floors: list[float] = []
    homes: list[Path] = []
    try:
        for n in range(args.runs):
            home = tmp / f"home-{n}"
            home.mkdir()
            homes.append(home)
            run_env = {**env, "HOME": str(home)}
            floors.append(import_floor(env))
            wall, _ = first_answer(agent, url, run_env, tmp)
            figures["cold"].append(wall)
            floors.append(import_floor(env))
            wall, session = first_answer(agent, url, run_env, tmp)
            figures["warm"].append(wall)
            floors.append(import_floor(env))
            wall, _ = first_answer(agent, url, run_env, tmp, "--resume", session)
            figures["resume"].append(wall)
            floors.append(import_floor(env))
            # a HOME of its own, and no other runner on the server: the session cannot move to
            # an idle one (the server's failover does not yet keep to the session's host)
            stop_daemons(home)
            alone = tmp / f"home-kill-{n}"
            alone.mkdir()
            homes.append(alone)
            run_env = {**env, "HOME": str(alone)}
            repl = Repl(agent, url, run_env, tmp)
            repl.ask("Say hi")
            session = newest_session(url)
            home = alone
            pid = runner_pid(home, bound_runner(url, session))
            marker = script_answer()
            os.kill(pid, signal.SIGKILL)
            start = time.perf_counter()
            repl.proc.stdin.write("Say hi again\n")
            repl.proc.stdin.flush()
            repl.wait_answer(marker)
            figures["kill"].append(time.perf_counter() - start)
            repl.close()
            stop_daemons(alone)
    finally:
        for home in homes:
            stop_daemons(home)
        stop(server)
        stop(mock)
        shutil.rmtree(tmp, ignore_errors=True)

    floor = statistics.median(floors)
    print(f"omnigent run --server, {args.runs} runs; `python -c 'import openai, trio'`: median {floor:.3f} s")
    labels = {"cold": "REPL start -> first answer, daemon started (fresh HOME)",
              "warm": "REPL start -> first answer, daemon reused, runner launched",
              "resume": "REPL --resume start -> first answer, runner reused",
              "kill": "SIGKILL of the runner -> next answer (replacement runner)"}
    for key, label in labels.items():
        med = statistics.median(figures[key])
        print(f"  {label}: median {med:.3f} s (min {min(figures[key]):.3f}, max {max(figures[key]):.3f}); "
              f"ratio to import {med / floor:.2f}")


if __name__ == "__main__":
    main()
