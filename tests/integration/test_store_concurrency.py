"""Several real processes on one store file, as when a server, a second
`omnigent run --continue` and a host share `chat.db`.

Children are `sys.executable -c` scripts that spin until a shared start time,
so they really do hit the file at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from omnigent.store import MIGRATIONS, Store
from omnigent.store.db import applied_migrations

REPO = Path(__file__).resolve().parents[2]

APPENDER = r"""
import sys, time
from omnigent.store import Store
path, shared, worker, count, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
store = Store(path)
own = store.create_conversation(agent_id=None)["id"]
while time.time() < start:
    pass
for i in range(count):
    store.append_item(shared, {"type": "message", "role": "user", "content": f"w{worker}-{i}"})
    store.append_item(own, {"type": "message", "role": "user", "content": f"w{worker}-{i}"})
store.close()
print(own)
"""

OPENER = r"""
import sys, time
from omnigent.store import Store
root, rounds, start, gap = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
for k in range(rounds):
    while time.time() < start + k * gap:
        pass
    Store(f"{root}/round{k}/chat.db").close()
"""


def _run_all(scripts: list[list[str]]) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    procs = [
        subprocess.Popen([sys.executable, "-c", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for argv in scripts
    ]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert "locked" not in err, err
        assert proc.returncode == 0, err
        outs.append(out.strip())
    return outs


def test_four_processes_append_concurrently(tmp_path: Path):
    path = tmp_path / "chat.db"
    workers, count = 4, 200
    with Store(path) as store:
        shared = store.create_conversation(agent_id=None)["id"]
    start = time.time() + 1.5  # after every child has imported and opened
    owns = _run_all(
        [[APPENDER, str(path), shared, str(w), str(count), str(start)] for w in range(workers)]
    )

    with Store(path) as store:
        rows = store.conn.execute(
            "SELECT position, data FROM conversation_items WHERE conversation_id = ? ORDER BY position", [shared]
        ).fetchall()
        assert [r[0] for r in rows] == list(range(workers * count))
        texts = [item["content"] for item in store.list_items(shared)]
        assert sorted(texts) == sorted(f"w{w}-{i}" for w in range(workers) for i in range(count))
        # each worker's own appends kept their order within the shared conversation
        for w in range(workers):
            mine = [t for t in texts if t.startswith(f"w{w}-")]
            assert mine == [f"w{w}-{i}" for i in range(count)]
        assert store.get_conversation(shared)["item_count"] == workers * count
        for w, own in enumerate(owns):
            items = store.list_items(own)
            assert [i["content"] for i in items] == [f"w{w}-{i}" for i in range(count)]
            positions = store.conn.execute(
                "SELECT position FROM conversation_items WHERE conversation_id = ? ORDER BY position", [own]
            ).fetchall()
            assert [p[0] for p in positions] == list(range(count))
        assert store.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


@pytest.mark.slow  # moved out of the default run to keep it under 5 minutes; .ci/run runs it
def test_processes_opening_a_fresh_file_at_once(tmp_path: Path):
    rounds = 20
    start = time.time() + 0.75
    # one race per round: every child opens round k's fresh file at the same instant
    _run_all([[OPENER, str(tmp_path), str(rounds), str(start), "0.05"] for _ in range(4)])
    for k in range(rounds):
        with Store(tmp_path / f"round{k}" / "chat.db") as store:
            applied = sorted(applied_migrations(store.db))
            assert applied == [m.name for m in MIGRATIONS]
            assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
