"""The host daemon and `omnigent run --server` with real processes: a server, daemons, runners, mocks.

Every test starts its daemons under its own HOME and stops every one of them
in a `finally` (`_stop_all`: SIGTERM, then SIGKILL), whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
import trio

from omnigent.host import records
from omnigent.host.daemon_client import ensure_daemon, find_daemon
from tests.conftest import configure_mock_llm
from tests.support.processes import stop as stop_proc

MODEL = "mock-daemon"


@pytest.fixture
def server(mock_credentials_env, tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "omnigent", "server", "--runners", "0", "--data-dir", str(tmp_path / "srv")],
        env=mock_credentials_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        text=True)
    try:
        line = proc.stdout.readline()
        assert "listening on " in line, proc.stderr.read()
        yield line.split("listening on ")[1].split()[0]
    finally:
        stop_proc(proc)


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "h"
    home.mkdir()
    try:
        yield home
    finally:
        _stop_all(home)


def _stop_all(home: Path) -> None:
    """Stop every daemon whose lock is held under `home` (and whatever its host.pid names)."""
    pids = set()
    for record in (home / ".omnigent" / "daemons").glob("*.json"):
        data = records.read_json(record) or {}
        if isinstance(data.get("pid"), int) and records.lock_held(record.with_suffix(".lock")):
            pids.add(data["pid"])
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while pids and time.monotonic() < deadline:
        pids = {pid for pid in pids if _alive(pid)}
        time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _env(base: dict[str, str], home: Path, **extra: str) -> dict[str, str]:
    return {**base, "HOME": str(home), **extra}


def _agent(tmp_path: Path) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(f"name: daemon_agent\nexecutor: {{harness: openai-agents, model: {MODEL}}}\nprompt: hi\n")
    return path


def _run_p(agent: Path, server: str, env: dict[str, str], cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omnigent", "run", str(agent), "-p", "hello", "--server", server,
                           *extra], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def _launched(home: Path) -> list[tuple[str, str, int]]:
    text = "".join(p.read_text() for p in (home / ".omnigent/logs/host-daemon").glob("daemon-*.log"))
    return [(m[0], m[1], int(m[2])) for m in
            re.findall(r"Launched runner (\S+) for workspace (\S+) \(pid=(\d+)\)", text)]


def _ensure(server: str, home: Path, env: dict[str, str], **kw):
    """`ensure_daemon` as the CLI runs it, in this process but with `env` as the environment."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        return trio.run(lambda: ensure_daemon(server, home=home, token=None, **kw))
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_start_then_reuse_with_private_detached_files(server, home, mock_credentials_env):
    env = _env(mock_credentials_env, home)
    first = _ensure(server, home, env)
    second = _ensure(server, home, env)
    assert (second.pid, second.host_id) == (first.pid, first.host_id)
    paths = records.Paths.of(home, server)
    assert paths.pid_file.read_text() == f"{first.pid}\n{paths.server_url}\n"
    record = json.loads(paths.record.read_text())
    assert record["pid"] == first.pid and record["host_id"] == first.host_id
    assert record["protocol_version"] == first.protocol_version and Path(record["log_path"]).is_file()
    for path in (paths.identity, paths.record, paths.pid_file, paths.socket, Path(record["log_path"])):
        assert path.stat().st_mode & 0o777 == 0o600, path
    assert (home / ".omnigent" / "daemons").stat().st_mode & 0o777 == 0o700
    # detached: its own session; stdin /dev/null, stdout and stderr the log file
    assert os.getsid(first.pid) == first.pid
    assert os.readlink(f"/proc/{first.pid}/fd/0") == "/dev/null"
    assert os.readlink(f"/proc/{first.pid}/fd/1") == os.readlink(f"/proc/{first.pid}/fd/2") == record["log_path"]
    identity = json.loads(paths.identity.read_text())
    assert identity["host_id"] == first.host_id and identity["server_url"] == paths.server_url
    assert trio.run(first.wait_online)  # a started daemon answers before its link is up (see the 403 test)
    host = httpx.get(f"{server}/v1/hosts/{first.host_id}", timeout=5).json()
    assert host["online"] is True


def test_stale_record_is_replaced_and_its_pid_never_signalled(server, home, mock_credentials_env):
    paths = records.Paths.of(home, server)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        records.write_private(paths.record, json.dumps({"pid": bystander.pid, "server_url": paths.server_url,
                                                        "control_socket": str(paths.socket)}))
        records.write_pid_file(paths, bystander.pid)
        paths.lock.touch()  # a lock file nobody holds
        info = _ensure(server, home, _env(mock_credentials_env, home))
        assert info.pid != bystander.pid
        assert bystander.poll() is None  # alive: never signalled
        assert paths.pid_file.read_text().splitlines()[0] == str(info.pid)
    finally:
        bystander.kill()
        bystander.wait()


def test_concurrent_starts_get_one_daemon(server, home, mock_credentials_env):
    env = _env(mock_credentials_env, home)
    procs = [subprocess.Popen([sys.executable, "-m", "omnigent", "host", "--server", server], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [proc.communicate(timeout=60) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), outs
    pids = {re.search(r"pid (\d+)", out).group(1) for out, _ in outs}
    assert len(pids) == 1, outs
    daemons = [p for p in (home / ".omnigent/logs/host-daemon").glob("daemon-*.log")]
    assert len(daemons) == 1  # the others never spawned one


def test_stop_and_status(server, home, mock_credentials_env, mock_llm_server_url, tmp_path):
    env = _env(mock_credentials_env, home)
    configure_mock_llm(mock_llm_server_url, [{"text": "STOP_OK"}], key=MODEL)
    done = _run_p(_agent(tmp_path), server, env, tmp_path)
    assert done.returncode == 0 and "STOP_OK" in done.stdout, done.stderr
    ((runner_id, _, runner_pid),) = _launched(home)
    status = subprocess.run([sys.executable, "-m", "omnigent", "host", "status"], env=env, capture_output=True,
                            text=True, timeout=30)
    assert status.returncode == 0 and "online" in status.stdout and "runners 1" in status.stdout, status
    stopped = subprocess.run([sys.executable, "-m", "omnigent", "host", "stop", "--server", server], env=env,
                             capture_output=True, text=True, timeout=30)
    assert stopped.returncode == 0 and "stopped host daemon pid" in stopped.stdout, stopped
    assert not _alive(runner_pid)
    assert not (home / ".omnigent/host.pid").exists()
    again = subprocess.run([sys.executable, "-m", "omnigent", "host", "status"], env=env, capture_output=True,
                           text=True, timeout=30)
    assert again.returncode == 1 and "no host daemon runs" in again.stderr


def test_sigterm_stops_runners_and_exits_within_5_s(server, home, mock_credentials_env, mock_llm_server_url,
                                                     tmp_path):
    env = _env(mock_credentials_env, home)
    configure_mock_llm(mock_llm_server_url, [{"text": "TERM_OK"}], key=MODEL)
    done = _run_p(_agent(tmp_path), server, env, tmp_path)
    assert done.returncode == 0, done.stderr
    ((_, _, runner_pid),) = _launched(home)
    pid = int((home / ".omnigent/host.pid").read_text().splitlines()[0])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5  # the contract's bound, not a measurement
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid) and not _alive(runner_pid)
    assert not records.lock_held(records.Paths.of(home, server).lock)


def test_runner_environment_has_no_client_or_host_credential(server, home, mock_credentials_env,
                                                             mock_llm_server_url, tmp_path):
    env = _env(mock_credentials_env, home, OMNIGENT_REMOTE_AUTH_TOKEN="client-token-123",
               OMNIGENT_SERVER_TOKEN="server-token-456", UNRELATED_SECRET="unrelated-789")
    configure_mock_llm(mock_llm_server_url, [{"text": "ENV_OK"}], key=MODEL)
    done = _run_p(_agent(tmp_path), server, env, tmp_path)
    assert done.returncode == 0 and "ENV_OK" in done.stdout, done.stderr
    ((runner_id, workspace, runner_pid),) = _launched(home)
    assert workspace == os.path.realpath(tmp_path)
    environ = dict(line.split("=", 1) for line in
                   Path(f"/proc/{runner_pid}/environ").read_bytes().decode().split("\0") if "=" in line)
    secret = json.loads(records.Paths.of(home, server).identity.read_text())["host_secret"]
    for name in ("OMNIGENT_REMOTE_AUTH_TOKEN", "OMNIGENT_SERVER_TOKEN", "UNRELATED_SECRET"):
        assert name not in environ
    blob = "\0".join(environ.values())
    for value in ("client-token-123", "server-token-456", "unrelated-789", secret):
        assert value not in blob
    assert environ["OMNIGENT_RUNNER_ID"] == runner_id and environ["OPENAI_API_KEY"] == "mock-key"
    daemon_pid = int((home / ".omnigent/host.pid").read_text().splitlines()[0])
    daemon_environ = Path(f"/proc/{daemon_pid}/environ").read_bytes().decode()
    assert "client-token-123" not in daemon_environ  # the client token stays with the CLI


@pytest.fixture
def second_mock():
    proc = subprocess.Popen([sys.executable, "-m", "omnigent.testing.mock_llm", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        assert "listening on " in line
        yield line.rsplit(" ", 1)[1].strip()
    finally:
        stop_proc(proc, timeout=5)


def test_two_clients_on_one_daemon_each_reach_their_own_model(server, home, mock_credentials_env,
                                                              mock_llm_server_url, second_mock, tmp_path):
    configure_mock_llm(mock_llm_server_url, [{"text": "FROM_MOCK_ONE"}], key=MODEL)
    configure_mock_llm(second_mock, [{"text": "FROM_MOCK_TWO"}], key=MODEL)
    agent = _agent(tmp_path)
    one = _run_p(agent, server, _env(mock_credentials_env, home), tmp_path)
    two = _run_p(agent, server, _env(mock_credentials_env, home, OPENAI_BASE_URL=f"{second_mock}/v1"), tmp_path)
    assert one.returncode == 0 and "FROM_MOCK_ONE" in one.stdout, one.stderr
    assert two.returncode == 0 and "FROM_MOCK_TWO" in two.stdout, two.stderr
    assert len({pid for _, _, pid in _launched(home)}) == 2  # a runner per session
    assert len(list((home / ".omnigent/logs/host-daemon").glob("daemon-*.log"))) == 1  # one daemon


def test_workspace_not_allowed_is_403(server, home, mock_credentials_env, tmp_path):
    info = _ensure(server, home, _env(mock_credentials_env, home))
    # a started daemon answers before its link to the server is up (as `--server` does, wait for it):
    # a post before that is 409 host_offline, which a loaded machine showed in CI
    assert trio.run(info.wait_online)
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    trio.run(info.allow_workspace, allowed)
    for workspace, status in ((str(tmp_path), 403), ("/", 403)):
        r = httpx.post(f"{server}/v1/hosts/{info.host_id}/runners", json={"workspace": workspace}, timeout=35)
        assert r.status_code == status and r.json()["error"]["code"] == "workspace_not_allowed", r.text
    r = httpx.post(f"{server}/v1/hosts/{info.host_id}/runners", json={"workspace": str(allowed)}, timeout=35)
    assert r.status_code == 201, r.text


_FAKE_OLD_DAEMON = textwrap.dedent("""
    import fcntl, json, os, signal, socket, sys
    lock, record, sock_path, ready = sys.argv[1:5]
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    s = socket.socket(socket.AF_UNIX)
    s.bind(sock_path)
    s.listen()
    with open(record, "w") as f:
        json.dump({"pid": os.getpid(), "server_url": sys.argv[5], "control_socket": sock_path,
                   "protocol_version": 0}, f)
    signal.signal(signal.SIGTERM, lambda *a: (os.unlink(sock_path), sys.exit(0)))
    open(ready, "w").close()
    while True:
        conn, _ = s.accept()
        conn.recv(65536)
        conn.sendall(json.dumps({"ok": True, "host_id": "host_old", "pid": os.getpid(),
                                 "protocol_version": 0}).encode() + b"\\n")
        conn.close()
""")


def test_a_daemon_of_another_protocol_version_is_replaced(server, home, mock_credentials_env, tmp_path):
    paths = records.Paths.of(home, server)
    paths.record.parent.mkdir(parents=True, mode=0o700)
    ready = tmp_path / "ready"
    old = subprocess.Popen([sys.executable, "-c", _FAKE_OLD_DAEMON, str(paths.lock), str(paths.record),
                            str(tmp_path / "old.sock"), str(ready), paths.server_url])
    try:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline and old.poll() is None:
            time.sleep(0.02)
        assert trio.run(find_daemon, paths).protocol_version == 0
        info = _ensure(server, home, _env(mock_credentials_env, home))
        assert old.wait(timeout=15) == 0  # asked to stop (SIGTERM), and it did
        assert info.pid != old.pid and info.protocol_version != 0
    finally:
        if old.poll() is None:
            old.kill()
            old.wait()


def test_idle_exit_when_started_on_demand(server, home, mock_credentials_env):
    env = _env(mock_credentials_env, home)
    proc = subprocess.Popen([sys.executable, "-m", "omnigent", "host", "--server", server, "--foreground",
                             "--idle-exit", "0.5"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and "no runner for" in err and "leaving" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_server_mode_errors_are_one_line(server, home, mock_credentials_env, tmp_path):
    env = _env(mock_credentials_env, home)
    agent = _agent(tmp_path)
    cases = [
        (["--resume", "conv_does_not_exist"], "Error: Conversation 'conv_does_not_exist' not found."),
        (["--continue"], "Error: No prior conversation for agent 'daemon_agent'."),
        (["--no-session"], "Error: --no-session is not supported with --server; the uploaded agent is "
                           "already scoped to the CLI session."),
    ]
    for extra, expected in cases:
        done = _run_p(agent, server, env, tmp_path, *extra)
        assert done.returncode != 0 and done.stderr.strip() == expected, (extra, done.stderr)
    bad = subprocess.run([sys.executable, "-m", "omnigent", "run", str(agent), "--server", "localhost:1"],
                         env=env, capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1 and "--server" in bad.stderr


@pytest.mark.slow
def test_server_restart_the_link_comes_back_and_runners_live_on(mock_credentials_env, home,
                                                                 mock_llm_server_url, tmp_path):
    """The server goes away: the daemon stays; back on the same port, the host is online again.
    Back with an empty store (its host unknown: 4003), the daemon registers anew, once.
    (Whether the runner itself survives is the runner's redial, tested with the runner.)"""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"

    def start(data: Path) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "omnigent", "server", "--runners", "0", "--port", str(port),
                                 "--data-dir", str(data)], env=mock_credentials_env, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
        assert "listening on " in proc.stdout.readline()
        return proc

    def wait_online(host_id: str) -> bool:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.get(f"{url}/v1/hosts/{host_id}", timeout=2)
                if r.status_code == 200 and r.json()["online"]:
                    return True
            time.sleep(0.1)
        return False

    env = _env(mock_credentials_env, home)
    configure_mock_llm(mock_llm_server_url, [{"text": "BEFORE"}], key=MODEL)
    server = start(tmp_path / "one")
    try:
        done = _run_p(_agent(tmp_path), url, env, tmp_path)
        assert done.returncode == 0 and "BEFORE" in done.stdout, done.stderr
        daemon_pid = int((home / ".omnigent/host.pid").read_text().splitlines()[0])
        host_id = records.read_identity(records.Paths.of(home, url))[0]
        stop_proc(server)
        assert _alive(daemon_pid)
        server = start(tmp_path / "one")
        assert wait_online(host_id)
        stop_proc(server)
        server = start(tmp_path / "two")  # a store that never heard of this host
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            identity = records.read_identity(records.Paths.of(home, url))
            if identity and identity[0] != host_id:
                break
            time.sleep(0.1)
        assert identity[0] != host_id and wait_online(identity[0])
        assert _alive(daemon_pid)
    finally:
        stop_proc(server)


def test_a_killed_daemon_leaves_no_runner_and_is_replaced(server, home, mock_credentials_env,
                                                          mock_llm_server_url, tmp_path):
    env = _env(mock_credentials_env, home)
    configure_mock_llm(mock_llm_server_url, [{"text": "KILL9_OK"}], key=MODEL)
    done = _run_p(_agent(tmp_path), server, env, tmp_path)
    assert done.returncode == 0, done.stderr
    ((_, _, runner_pid),) = _launched(home)
    pid = int((home / ".omnigent/host.pid").read_text().splitlines()[0])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _alive(runner_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(runner_pid)  # its stdin was the daemon's pipe: EOF ends it
    info = _ensure(server, home, env)  # the record is stale now (no lock): replaced
    assert info.pid != pid
    second = subprocess.run([sys.executable, "-m", "omnigent", "host", "--server", server, "--foreground"],
                            env=env, capture_output=True, text=True, timeout=30)
    assert second.returncode == 1 and f"already runs (pid {info.pid})" in second.stderr, second


@pytest.mark.slow
def test_unused_runner_ends_then_the_on_demand_daemon_leaves(server, home, mock_credentials_env,
                                                             mock_llm_server_url, tmp_path):
    # the daemon's idle clock starts with it too: 10 s leaves the -p run time to launch a runner
    env = _env(mock_credentials_env, home, OMNIGENT_RUNNER_IDLE_TIMEOUT="1")
    info = _ensure(server, home, env, idle_exit=10.0)
    configure_mock_llm(mock_llm_server_url, [{"text": "IDLE_OK"}], key=MODEL)
    done = _run_p(_agent(tmp_path), server, env, tmp_path)
    assert done.returncode == 0 and "IDLE_OK" in done.stdout, done.stderr
    ((runner_id, _, runner_pid),) = _launched(home)
    deadline = time.monotonic() + 40
    while _alive(info.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(info.pid) and not _alive(runner_pid)
    log = "".join(p.read_text() for p in (home / ".omnigent/logs/host-daemon").glob("daemon-*.log"))
    assert f"runner {runner_id} unused for" in log and "no runner for 10 s: leaving" in log
    assert len(_launched(home)) == 1  # the idle runner was not replaced


def test_bad_idle_timeout_is_one_line(server, home, mock_credentials_env, tmp_path):
    env = _env(mock_credentials_env, home, OMNIGENT_RUNNER_IDLE_TIMEOUT="soon")
    done = _run_p(_agent(tmp_path), server, env, tmp_path)
    assert done.returncode == 1 and done.stderr.strip() == (
        "Error: OMNIGENT_RUNNER_IDLE_TIMEOUT must be a number, not 'soon'")
