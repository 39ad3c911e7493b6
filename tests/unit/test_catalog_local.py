"""The local backend of `omnigent sessions`: the store file, never created, and live turns asked to cancel."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from omnigent.catalog.backend import CatalogError, UnknownSession
from omnigent.catalog.local import LocalCatalog
from omnigent.store import Store


def test_a_missing_store_is_empty_and_stays_missing(tmp_path):
    catalog = LocalCatalog(tmp_path / "chat.db")
    assert catalog.list_sessions(agent=None, limit=20, query=None) == []
    with pytest.raises(UnknownSession, match="omnigent sessions list"):
        catalog.session("conv_x")
    assert not (tmp_path / "chat.db").exists()


def test_rm_asks_another_live_process_to_cancel_gives_up_when_it_does_not_and_takes_an_orphan(
        tmp_path, monkeypatch):
    import omnigent.catalog.local as local

    monkeypatch.setattr(local, "CANCEL_WAIT", 0.3)  # this "owner" is a sleep: it never cancels
    path = tmp_path / "chat.db"
    with Store(path) as store:
        live = store.create_conversation(agent_id=None, title="busy")["id"]
        orphan = store.create_conversation(agent_id=None, title="left")["id"]
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        try:
            store.create_turn(live, None, owner_pid=other.pid)
            store.create_turn(orphan, None, owner_pid=dead.pid)
            catalog = LocalCatalog(path)
            with pytest.raises(CatalogError, match=f"omnigent process {other.pid} that did not stop"):
                catalog.delete(live)
            assert store.get_conversation(live) is not None
            turn = store.list_turns(live)[0]
            assert store.cancel_requested([turn["id"]]) == {turn["id"]} and turn["status"] == "queued"  # asked, not forced
            catalog.delete(orphan)
            assert store.get_conversation(orphan) is None
            catalog.close()
        finally:
            other.kill()
            other.wait()
    assert os.path.exists(path)
