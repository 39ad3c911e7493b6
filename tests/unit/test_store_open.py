"""What `check_store` and `verify` refuse before a store is used, changing nothing."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from omnigent.store import Store, StoreError
from omnigent.store.db import check_store, verify

LEGACY_STORE = Path(__file__).resolve().parents[1] / "resources" / "stores" / "chat-0.1.0.db"


def refused(path: Path) -> str:
    before = sorted(p.name for p in path.parent.iterdir())
    with pytest.raises(StoreError) as info:
        check_store(path)
    assert sorted(p.name for p in path.parent.iterdir()) == before  # nothing created, not even -wal/-shm
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"cannot open store: {path}: ")
    return text


def test_a_missing_or_good_store_passes(tmp_path):
    check_store(tmp_path / "none.db")
    assert list(tmp_path.iterdir()) == []
    Store(tmp_path / "chat.db").close()
    check_store(tmp_path / "chat.db")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.db"]


def test_refusals(tmp_path):
    (tmp_path / "dir").mkdir()
    assert refused(tmp_path / "dir").endswith("it is a directory")
    (tmp_path / "text").write_text("hello\n" * 100)
    assert "not an SQLite database" in refused(tmp_path / "text")
    (tmp_path / "cut.db").write_bytes(LEGACY_STORE.read_bytes()[:20000])
    assert "the file is truncated" in refused(tmp_path / "cut.db")
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE notes (x)")
    conn.close()
    assert "not an omnigent store" in refused(foreign)
    newer = tmp_path / "newer.db"
    Store(newer).close()
    with sqlite3.connect(newer) as conn:
        conn.execute("INSERT INTO migrations VALUES ('9999_future', 0)")
    conn.close()
    assert "newer omnigent (unknown migrations: 9999_future)" in refused(newer)


def test_verify_finds_damage_past_the_first_pages(tmp_path):
    data = LEGACY_STORE.read_bytes()
    half = len(data) // 2
    (tmp_path / "chat.db").write_bytes(data[:half] + b"\xff" * (len(data) - half))
    check_store(tmp_path / "chat.db")  # the cheap check cannot see it
    conn = sqlite3.connect(tmp_path / "chat.db")
    try:
        with pytest.raises(StoreError, match="the store is corrupt"):
            verify(conn, tmp_path / "chat.db")
    finally:
        conn.close()
    good = Store(tmp_path / "good.db")
    verify(good.conn, tmp_path / "good.db")
    good.close()
