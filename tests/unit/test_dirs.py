"""Private directories and files, and where they live, whatever the umask."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from omnigent.config.dirs import DiskError, check_free_space, data_dir, home_dir, private_dir, private_file
from omnigent.config.logs import close_log, host_logs_dir, logs_dir, open_log
from omnigent.store import Store, default_db_path


@pytest.fixture
def no_umask():
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_data_dir_follows_the_variable_and_the_daemon_home_does_not(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    monkeypatch.delenv("OMNIGENT_DATA_DIR", raising=False)
    assert data_dir() == home_dir() == tmp_path / "h" / ".omnigent"
    assert logs_dir() == host_logs_dir() == tmp_path / "h" / ".omnigent" / "logs"
    monkeypatch.setenv("OMNIGENT_DATA_DIR", str(tmp_path / "d"))
    assert data_dir() == tmp_path / "d" and default_db_path() == tmp_path / "d" / "chat.db"
    assert logs_dir() == tmp_path / "d" / "logs"
    assert home_dir() == tmp_path / "h" / ".omnigent"
    assert host_logs_dir() == tmp_path / "h" / ".omnigent" / "logs"


def test_private_dir_creates_0700_and_tightens(no_umask, tmp_path):
    deep = private_dir(tmp_path / "a" / "b")
    assert mode(tmp_path / "a") == mode(deep) == 0o700
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    private_dir(loose)
    assert mode(loose) == 0o700
    other = tmp_path / "other"
    other.mkdir(mode=0o755)
    private_dir(other, tighten=False)
    assert mode(other) == 0o755


def test_private_dir_errors_are_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(DiskError) as info:
        private_dir(tmp_path / "file" / "sub", "cannot create data directory")
    assert str(info.value) == f"cannot create data directory: {tmp_path / 'file' / 'sub'}: Not a directory"


def test_private_file_creates_0600_and_tightens(no_umask, tmp_path):
    private_file(tmp_path / "f")
    assert mode(tmp_path / "f") == 0o600
    (tmp_path / "g").write_text("kept")
    (tmp_path / "g").chmod(0o666)
    private_file(tmp_path / "g")
    assert mode(tmp_path / "g") == 0o600 and (tmp_path / "g").read_text() == "kept"


def test_store_files_are_0600_whatever_the_umask(no_umask, tmp_path):
    with Store(tmp_path / "data" / "chat.db") as store:
        store.upsert_agent("a", {"name": "a"})
        for name in ("chat.db", "chat.db-wal", "chat.db-shm"):
            assert mode(tmp_path / "data" / name) == 0o600, name
    assert mode(tmp_path / "data") == 0o700


def test_store_tightens_an_existing_file_and_its_companions(no_umask, tmp_path):
    Store(tmp_path / "chat.db").close()
    (tmp_path / "chat.db").chmod(0o644)
    (tmp_path / "chat.db-wal").write_bytes(b"")
    (tmp_path / "chat.db-wal").chmod(0o666)
    with Store(tmp_path / "chat.db"):
        assert mode(tmp_path / "chat.db") == mode(tmp_path / "chat.db-wal") == 0o600


def test_log_files_are_0600_in_0700_folders(no_umask, tmp_path):
    handler = open_log("host", tmp_path / "logs")
    try:
        logging.getLogger("omnigent.test").info("a line")
    finally:
        close_log(handler)
    (path,) = (tmp_path / "logs" / "host").glob("host-*.log")
    assert mode(path) == 0o600 and mode(path.parent) == mode(tmp_path / "logs") == 0o700
    assert "a line" in path.read_text()


def test_no_free_space_is_refused(monkeypatch, tmp_path):
    real = os.statvfs(tmp_path)

    class Full:
        f_bavail, f_frsize = 3, real.f_frsize

    monkeypatch.setattr(os, "statvfs", lambda path: Full)
    with pytest.raises(DiskError, match=r": No space left on device \(\d+ KiB free\)$"):
        check_free_space(tmp_path)


def test_a_log_that_cannot_be_written_is_one_line_and_left_nowhere(monkeypatch, tmp_path):
    import errno
    import io

    import omnigent.config.logs as logs

    class FullStream(io.StringIO):
        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(logs._FileHandler, "_open", lambda self: FullStream())
    before = logging.getLogger().handlers[:]
    with pytest.raises(DiskError) as info:
        open_log("host", tmp_path / "logs")
    assert str(info.value).startswith(f"cannot write log: {tmp_path / 'logs' / 'host'}/host-")
    assert str(info.value).endswith(": No space left on device")
    assert list((tmp_path / "logs" / "host").iterdir()) == []
    assert logging.getLogger().handlers == before
