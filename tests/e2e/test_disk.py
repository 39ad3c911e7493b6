"""The disk as a user meets it: private files, and one clear line for every disk or store failure.

Through the CLI as a user runs it, on real files. Read-only and full file
systems are real mounts (a small tmpfs) when the test runs as root, which
ignores permission bits; elsewhere read-only is a 0500 directory, and the
full-disk tests skip when mounting is not permitted.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import configure_mock_llm
from tests.e2e._repl_helpers import release_gates, wait_for_gate

RUN_TIMEOUT = 60


@pytest.fixture
def env(mock_credentials_env, tmp_path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    return {**mock_credentials_env, "HOME": str(home)}


def home_of(env) -> Path:
    return Path(env["HOME"])


def agent(tmp_path: Path, model: str) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(f"name: disk\nprompt: Be brief.\nexecutor:\n  model: {model}\n")
    return path


def scripted(url: str, *answers: str) -> str:
    model = f"disk-{uuid.uuid4().hex[:8]}"
    configure_mock_llm(url, [{"text": a} for a in answers] or [{"text": "ok"}], key=model)
    return model


def omnigent(env, *args, umask: int | None = None, **kwargs) -> subprocess.CompletedProcess:
    def preexec() -> None:
        if umask is not None:
            os.umask(umask)

    return subprocess.run([sys.executable, "-m", "omnigent", *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT, preexec_fn=preexec, **kwargs)


def one_line_error(result: subprocess.CompletedProcess, *needles: str) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def snapshot(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under root with its mode and (for files) content: what 'nothing changed' compares."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (st.st_mode, p.read_bytes() if p.is_file() else None)
    return out


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- mounts -----------------------------------------------------------------------


def _mount(target: Path, *options: str) -> None:
    target.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(target)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")


@contextmanager
def tmpfs(target: Path, size: str = "4m") -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    _mount(target, f"size={size}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def remount_read_only(target: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(target)], check=True)


@contextmanager
def read_only(target: Path) -> Iterator[Path]:
    """`target` (created if need be, with what `fill` put there) made read-only for this process."""
    if os.geteuid() == 0:  # root ignores permission bits: a read-only mount
        with tmpfs(target):
            yield target
        return
    target.mkdir(parents=True, exist_ok=True)
    try:
        yield target
    finally:
        for p in [target, *target.rglob("*")]:
            if p.is_dir():
                p.chmod(0o700)


def make_read_only(target: Path) -> None:
    if os.geteuid() == 0:
        remount_read_only(target)
    else:
        for p in [*target.rglob("*"), target]:
            if p.is_dir():
                p.chmod(0o500)


def fill(folder: Path) -> None:
    """Fill the file system of `folder` to the last block."""
    with open(folder / "filler", "ab", buffering=0) as f:
        for chunk in (65536, 512):
            try:
                while f.write(b"\0" * chunk):
                    pass
            except OSError:
                pass


# --- §4 private files --------------------------------------------------------------


def test_store_logs_and_dirs_are_private_whatever_the_umask(env, tmp_path, mock_llm_server_url):
    model = scripted(mock_llm_server_url, "one")
    result = omnigent(env, "run", agent(tmp_path, model), "-p", "hi", umask=0)
    assert result.returncode == 0, result.stderr
    data = home_of(env) / ".omnigent"
    assert mode(data) == 0o700
    files = [p for p in data.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"chat.db"}
    assert any(p.parent.name == "host" for p in files) and any(p.parent.name == "runner" for p in files)
    for p in data.rglob("*"):
        assert mode(p) == (0o700 if p.is_dir() else 0o600), p
    # while a connection is open, the WAL companions exist: they are private too
    conn = sqlite3.connect(data / "chat.db")
    conn.execute("SELECT COUNT(*) FROM conversations").fetchone()
    conn.execute("PRAGMA journal_mode").fetchone()
    try:
        for suffix in ("-wal", "-shm"):
            companion = data / f"chat.db{suffix}"
            assert companion.exists() and mode(companion) == 0o600
    finally:
        conn.close()


@pytest.mark.slow
def test_looser_modes_of_an_existing_store_are_tightened(env, tmp_path, mock_llm_server_url):
    model = scripted(mock_llm_server_url, "one", "two")
    assert omnigent(env, "run", agent(tmp_path, model), "-p", "hi").returncode == 0
    data = home_of(env) / ".omnigent"
    data.chmod(0o755)
    (data / "logs").chmod(0o755)
    (data / "chat.db").chmod(0o644)
    # another process holds the store open, its WAL companions as loose as an older release made them
    other = sqlite3.connect(data / "chat.db")
    try:
        other.execute("SELECT COUNT(*) FROM conversations").fetchone()
        for suffix in ("-wal", "-shm"):
            (data / f"chat.db{suffix}").chmod(0o644)
        result = omnigent(env, "run", agent(tmp_path, model), "-p", "again", "--continue", umask=0o022)
        assert result.returncode == 0, result.stderr
        assert result.stdout == "two\n"
        assert mode(data) == mode(data / "logs") == 0o700
        for name in ("chat.db", "chat.db-wal", "chat.db-shm"):
            assert mode(data / name) == 0o600, name
    finally:
        other.close()


@pytest.mark.slow
def test_data_dir_moves_store_history_and_logs_but_not_home(env, tmp_path, mock_llm_server_url):
    model = scripted(mock_llm_server_url, "one")
    data = tmp_path / "elsewhere" / "data"
    result = omnigent({**env, "OMNIGENT_DATA_DIR": str(data)}, "run", agent(tmp_path, model), "-p", "hi", umask=0)
    assert result.returncode == 0, result.stderr
    assert (data / "chat.db").exists() and list((data / "logs" / "host").glob("host-*.log"))
    assert mode(data) == 0o700 and mode(data / "chat.db") == 0o600
    assert not (home_of(env) / ".omnigent").exists()


def test_no_session_writes_nothing_under_home(env, tmp_path, mock_llm_server_url):
    model = scripted(mock_llm_server_url, "one")
    result = omnigent(env, "run", agent(tmp_path, model), "-p", "hi", "--no-session")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "one\n"
    assert list(home_of(env).iterdir()) == []


@pytest.mark.slow
def test_no_session_repl_keeps_no_input_history(env, tmp_path, mock_llm_server_url):
    model = scripted(mock_llm_server_url, "one")
    result = omnigent(env, "run", agent(tmp_path, model), "--no-session", input="hello\n")
    assert result.returncode == 0, result.stderr
    assert "one" in result.stdout
    assert list(home_of(env).iterdir()) == []


def test_no_session_succeeds_with_an_unwritable_home(env, tmp_path, mock_llm_server_url):
    model = scripted(mock_llm_server_url, "fine")
    with read_only(tmp_path / "ro") as ro:
        make_read_only(ro)
        result = omnigent({**env, "HOME": str(ro)}, "run", agent(tmp_path, model), "-p", "hi", "--no-session")
        assert result.returncode == 0, result.stderr
        assert result.stdout == "fine\n"
        assert list(ro.iterdir()) == []


# --- §5 one line for every disk or store failure -----------------------------------


def test_corrupt_store_is_one_line_and_untouched(env, tmp_path):
    data = home_of(env) / ".omnigent"
    data.mkdir(mode=0o755)
    (data / "chat.db").write_bytes(b"this is not a database\n" * 100)
    before = snapshot(home_of(env))
    line = one_line_error(omnigent(env, "run", agent(tmp_path, "m"), "-p", "hi"),
                          f"cannot open store: {data / 'chat.db'}: ", "not an SQLite database")
    assert "Traceback" not in line
    assert snapshot(home_of(env)) == before


LEGACY_STORE = Path(__file__).resolve().parents[1] / "resources" / "stores" / "chat-0.1.0.db"


@pytest.mark.slow
@pytest.mark.parametrize(("damage", "needle"), [
    (lambda data: data[: len(data) // 2], "the file is truncated"),
    (lambda data: data[: len(data) // 2] + b"\xff" * (len(data) - len(data) // 2), "the store is corrupt"),
])
def test_a_damaged_store_is_one_line(env, tmp_path, damage, needle):
    db = home_of(env) / ".omnigent" / "chat.db"
    db.parent.mkdir()
    db.write_bytes(damage(LEGACY_STORE.read_bytes()))
    one_line_error(omnigent(env, "run", agent(tmp_path, "m"), "-p", "again"), f"cannot open store: {db}: ", needle)


@pytest.mark.slow
def test_store_of_a_newer_version_is_one_line_and_untouched(env, tmp_path, mock_llm_server_url):
    model = scripted(mock_llm_server_url, "one")
    assert omnigent(env, "run", agent(tmp_path, model), "-p", "hi").returncode == 0
    db = home_of(env) / ".omnigent" / "chat.db"
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO migrations VALUES ('9999_from_the_future', 0)")
    conn.close()
    before = snapshot(home_of(env))
    for args in (("run", agent(tmp_path, model), "-p", "again"), ("server", "--runners", "0")):
        one_line_error(omnigent(env, *args), f"cannot open store: {db}: ", "newer omnigent", "9999_from_the_future")
        assert snapshot(home_of(env)) == before


@pytest.mark.slow
def test_read_only_data_dir_is_one_line(env, tmp_path, mock_llm_server_url):
    model = scripted(mock_llm_server_url, "one")
    with read_only(tmp_path / "ro") as ro:
        data = ro / "data"
        run_env = {**env, "OMNIGENT_DATA_DIR": str(data)}
        assert omnigent(run_env, "run", agent(tmp_path, model), "-p", "hi").returncode == 0
        make_read_only(ro)
        before = snapshot(ro)
        for args in (("run", agent(tmp_path, model), "-p", "again"), ("server", "--runners", "0")):
            one_line_error(omnigent(run_env, *args), f"{data}")
            assert snapshot(ro) == before


def test_unwritable_home_is_one_line(env, tmp_path):
    with read_only(tmp_path / "ro") as ro:
        make_read_only(ro)
        for args in (("run", agent(tmp_path, "m"), "-p", "hi"), ("server", "--runners", "0")):
            one_line_error(omnigent({**env, "HOME": str(ro)}, *args),
                           f"cannot create data directory: {ro / '.omnigent'}: ")
        assert list(ro.iterdir()) == []


@pytest.mark.parametrize("existing_store", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_full_disk_is_one_line_and_nothing_changes(env, tmp_path, mock_llm_server_url, existing_store):
    model = scripted(mock_llm_server_url, "one")
    with tmpfs(tmp_path / "small", size="2m") as small:
        home = small / "home"
        home.mkdir()
        run_env = {**env, "HOME": str(home)}
        if existing_store:
            assert omnigent(run_env, "run", agent(tmp_path, model), "-p", "hi").returncode == 0
        fill(small)
        before = snapshot(home)
        for args in (("run", agent(tmp_path, model), "-p", "again"), ("server", "--runners", "0")):
            one_line_error(omnigent(run_env, *args), "No space left on device")
            assert snapshot(home) == before


@pytest.mark.slow
def test_disk_filling_mid_turn_does_not_corrupt_the_store(env, tmp_path, mock_llm_server_url):
    model = f"disk-{uuid.uuid4().hex[:8]}"
    configure_mock_llm(mock_llm_server_url, [{"block": True, "text": "x" * 200_000}, {"text": "after"}], key=model)
    with tmpfs(tmp_path / "small", size="3m") as small:
        home = small / "home"
        home.mkdir()
        run_env = {**env, "HOME": str(home)}
        proc = subprocess.Popen([sys.executable, "-m", "omnigent", "run", str(agent(tmp_path, model)), "-p", "hi"],
                                env=run_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_for_gate(mock_llm_server_url, model)
            fill(small)
            release_gates(mock_llm_server_url)
            out, err = proc.communicate(timeout=RUN_TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        # The turn fails with the cause, in one line; the server stays up to say so.
        assert proc.returncode == 1 and "Traceback" not in err, err
        assert err.strip().splitlines() == [f"Error: cannot write store: {home / '.omnigent' / 'chat.db'}: " \
                                               "database or disk is full"], err
        (small / "filler").unlink()
        db = home / ".omnigent" / "chat.db"
        with sqlite3.connect(db) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        conn.close()
        result = omnigent(run_env, "run", agent(tmp_path, model), "-p", "again", "--continue")
        assert result.returncode == 0, result.stderr
        assert result.stdout == "after\n"


def test_prompt_must_be_utf8_and_leaves_nothing(env, tmp_path):
    result = subprocess.run([os.fsencode(sys.executable), b"-m", b"omnigent", b"run",
                             os.fsencode(agent(tmp_path, "m")), b"-p", b"caf\xe9 \xff"],
                            env=env, capture_output=True, timeout=RUN_TIMEOUT)
    assert result.returncode == 1
    lines = result.stderr.decode().strip().splitlines()
    assert lines == ["Error: the prompt is not valid UTF-8 (byte 0xe9 at character 4)"]
    assert list(home_of(env).iterdir()) == []


@pytest.mark.parametrize("prompt", ["", "  \n"])
def test_empty_prompt(env, tmp_path, prompt):
    result = omnigent(env, "run", agent(tmp_path, "m"), "-p", prompt)
    assert (result.returncode, result.stderr) == (1, "Error: empty prompt\n")
    assert list(home_of(env).iterdir()) == []


def test_mock_llm_on_a_taken_port_is_one_line(env):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = omnigent(env, "mock-llm", "--port", port)
    assert result.returncode == 1
    assert result.stderr == f"Error: cannot listen on 127.0.0.1:{port}: Address already in use\n"
