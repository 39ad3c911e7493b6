"""Opening the store's SQLite file: checks, pragmas, migrations, transactions.

Several omnigent processes may share one file (a server, a second
`omnigent run --continue`, a host daemon), so the connection rules live here in
one place: WAL, `synchronous=NORMAL`, temporary files in memory, a 5 s busy timeout, foreign keys on,
legacy transaction control (sqlite-utils 4 rejects `autocommit=` connections)
and `BEGIN IMMEDIATE` for every read-then-write. A deferred read lock that is
later upgraded fails with SQLITE_BUSY without waiting (stack-notes section 6).

The migrations themselves, the schema's history, are in `migrations.py`; this
module checks a file's recorded names against them and applies the missing ones.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import timeline
from ..config.dirs import DiskError, describe, private_dir, private_file, tighten
from .errors import StoreError
from .migrations import MIGRATIONS
from .search import reconcile as reconcile_search_index

if TYPE_CHECKING:
    import sqlite_utils  # imported when a store is opened: ~55 ms a cold start can overlap

BUSY_TIMEOUT_S = 5.0
MEMORY = ":memory:"
SQLITE_MAGIC = b"SQLite format 3\x00"
# SQLite gives these the database file's mode, but ones left by an older
# release may be looser: they are tightened with it.
COMPANIONS = ("-wal", "-shm", "-journal")


# The names this release knows, derived where they are read (a test patches them with MIGRATIONS).
_KNOWN = frozenset(m.name for m in MIGRATIONS)
_ADDITIVE = frozenset(m.name for m in MIGRATIONS if m.additive)


@contextlib.contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """`BEGIN IMMEDIATE` ... `COMMIT`, rolled back on any exception.

    Taking the write lock up front makes the busy timeout apply to the wait,
    so concurrent writers queue instead of failing with "database is locked".
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    try:
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def open_database(path: str | Path, *, clock: Callable[[], float] = time.time) -> sqlite_utils.Database:
    """Open (creating if needed) and migrate the store at `path`.

    Raises StoreError with one line, `<what failed>: <path>: <cause>`, for a
    directory, an unwritable location, a file that is not SQLite (left
    untouched), a SQLite file that belongs to something else or to a newer
    omnigent. The file and its -wal/-shm are 0600 whatever the umask, and
    the directories it creates 0700.
    """
    import sqlite_utils

    target = path if str(path) == MEMORY else Path(path).expanduser()
    if isinstance(target, Path):
        _check_file(target)
        try:
            private_dir(target.parent, "cannot create data directory", tighten=False)
        except DiskError as e:
            raise StoreError(str(e)) from e
        try:
            private_file(target)
            for suffix in COMPANIONS:
                tighten(f"{target}{suffix}")
        except OSError as e:
            raise _error("cannot create store", target, e) from e
    try:
        conn = sqlite3.connect(str(target), timeout=BUSY_TIMEOUT_S)
    except sqlite3.Error as e:
        raise _error("cannot open store", target, e) from e
    try:
        # Read before any write, so a foreign or newer file is rejected untouched.
        _check_schema(conn, target)
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA synchronous = NORMAL")
        # Statement journals (a write inside a savepoint, FTS triggers) in memory: on disk
        # each one was a temporary file created, written and unlinked, about one per turn.
        conn.execute("PRAGMA temp_store = MEMORY")
        db = sqlite_utils.Database(conn, execute_plugins=False)
        if timeline.counting():  # a benchmark's timeline: each segment's statements
            conn.set_trace_callback(timeline.count_statement)
        if target != MEMORY:
            _enable_wal(db)
        migrate(db, clock=clock)
        if "0010_items_fts" in applied_migrations(db):  # (a test may migrate only part of the way)
            reconcile_search_index(conn, lambda: write_transaction(conn))
    except StoreError:
        conn.close()
        raise
    except sqlite3.Error as e:
        conn.close()
        raise _error("cannot open store", target, e) from e
    return db


def check_store(path: str | Path) -> None:
    """Refuse a store this process could not use, before anything is written anywhere.

    The cheap half of `open_database` (sqlite3 only, no sqlite-utils): a
    directory, an unreadable or unwritable file, a file that is not SQLite,
    a foreign or newer database. A missing file passes (it will be created).
    Raises StoreError; changes nothing on disk.
    """
    target = Path(path).expanduser()
    _check_file(target)
    if not target.exists() or target.stat().st_size == 0:
        return
    try:
        # mode=rw: never creates the file; a WAL file's -wal/-shm go with the last close
        conn = sqlite3.connect(f"file:{_uri_path(target)}?mode=rw", uri=True, timeout=BUSY_TIMEOUT_S)
    except sqlite3.Error as e:
        raise _error("cannot open store", target, e) from e
    try:
        _check_schema(conn, target)
    except sqlite3.Error as e:
        raise _error("cannot open store", target, e) from e
    finally:
        conn.close()


def _check_file(target: Path) -> None:
    if target == Path(MEMORY):
        return
    if target.is_dir():
        raise _error("cannot open store", target, "it is a directory")
    if not target.exists():
        return
    if not os.access(target, os.R_OK | os.W_OK):
        read_only = os.statvfs(target).f_flag & os.ST_RDONLY
        raise _error("cannot open store", target, os.strerror(errno.EROFS) if read_only
                     else "permission denied (it must be readable and writable)")
    # Another process may be writing the file right now (creating it, checkpointing): its
    # header can briefly promise pages not yet on disk, so only a cut that stays is one.
    for attempt in range(_TRUNCATION_CHECKS):
        try:
            with open(target, "rb") as f:
                head = f.read(100)
            size = target.stat().st_size
        except OSError as e:
            raise _error("cannot open store", target, e) from e
        if head and not head.startswith(SQLITE_MAGIC):
            raise _error("cannot open store", target, "not an SQLite database (corrupt, or another kind of file)")
        if len(head) < 100 or not _truncated(head, size):
            return
        if attempt + 1 < _TRUNCATION_CHECKS:
            time.sleep(0.05)
    raise _error("cannot open store", target, "the file is truncated (the store is corrupt; "
                                              "move it aside to start afresh)")


_TRUNCATION_CHECKS = 4


def _truncated(header: bytes, size: int) -> bool:
    """The header's page count says the file is longer than it is (a cut copy, say).

    The count is trusted only when its 'valid-for' number matches the change
    counter (sqlite.org/fileformat2.html, section 1.3.9)."""
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    valid = header[92:96] == header[24:28]
    return valid and pages > 0 and size < pages * page_size


def verify(conn: sqlite3.Connection, path: object) -> None:
    """`PRAGMA quick_check`: a store corrupt beyond its first pages is a StoreError
    at open, not an internal error in the middle of a request (~35 ms for 24 MB)."""
    try:
        rows = [r[0] for r in conn.execute("PRAGMA quick_check(1)")]
    except sqlite3.DatabaseError as e:
        raise _error("cannot open store", path, e) from e
    if rows != ["ok"]:
        raise _error("cannot open store", path, f"the store is corrupt ({' '.join(rows)[:200]}); "
                                                 "move it aside to start afresh")


def _check_schema(conn: sqlite3.Connection, target: object) -> None:
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if tables and "migrations" not in tables:
        raise _error("cannot open store", target, "it is an SQLite database but not an omnigent store")
    if "migrations" in tables:
        unknown = {r[0] for r in conn.execute("SELECT name FROM migrations")} - _KNOWN
        if unknown - _ADDITIVE:  # known additive names there were recorded by this release's own line
            raise _newer(target, unknown)


def _newer(target: object, unknown: set[str]) -> StoreError:
    return _error("cannot open store", target,
                  f"store was written by a newer omnigent (unknown migrations: {', '.join(sorted(unknown))})")


def _error(what: str, target: object, cause: object) -> StoreError:
    """`<what>: <path>: <cause>` on one line; sqlite's 'file is not a database' explained."""
    text = describe(cause)
    if isinstance(cause, sqlite3.DatabaseError) and text in ("file is not a database", "database disk image is malformed"):
        text += " (the store is corrupt; move it aside to start afresh)"
    return StoreError(f"{what}: {target}: {text}")


def _uri_path(target: Path) -> str:
    from urllib.parse import quote

    return quote(str(target.resolve()))


def _enable_wal(db: sqlite_utils.Database) -> None:
    # Switching a fresh file to WAL needs an exclusive lock; a process racing
    # us on the same fresh file can make it fail once without the busy
    # handler, so retry within the busy timeout.
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            db.enable_wal()
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


_RECORDS = """
CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS additive_migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL);
"""


def _names(conn: sqlite3.Connection, table: str) -> set[str]:
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", [table]).fetchone():
        return set()
    return {r[0] for r in conn.execute(f"SELECT name FROM {table}")}


def applied_migrations(db: sqlite_utils.Database) -> set[str]:
    """Names of every migration applied to the file, additive or not (unknown ones included)."""
    return _names(db.conn, "migrations") | _names(db.conn, "additive_migrations")


def migrate(db: sqlite_utils.Database, *, clock: Callable[[], float] = time.time) -> list[str]:
    """Apply pending migrations; returns the names applied by this call.

    Runs under BEGIN IMMEDIATE and re-reads the applied set inside the lock,
    so two processes opening a fresh file at once apply each migration once.
    An unknown name in `migrations` (a newer release's incompatible change)
    refuses the file; unknown additive ones (`additive_migrations`) are fine.
    Known additive names that this release line once recorded in `migrations`
    are moved to `additive_migrations`, so release 0.1.0 can use the file again.
    """
    strict = _names(db.conn, "migrations")
    unknown = strict - _KNOWN
    if unknown:
        raise StoreError(f"store was written by a newer omnigent (unknown migrations: {', '.join(sorted(unknown))})")
    if applied_migrations(db) >= _KNOWN and not strict & _ADDITIVE:
        return []
    done: list[str] = []
    with write_transaction(db.conn):
        db.executescript(_RECORDS)
        misplaced = sorted(_names(db.conn, "migrations") & _ADDITIVE)
        for name in misplaced:
            db.execute("INSERT OR IGNORE INTO additive_migrations (name, applied_at)"
                       " SELECT name, applied_at FROM migrations WHERE name = ?", [name])
            db.execute("DELETE FROM migrations WHERE name = ?", [name])
        applied = applied_migrations(db)
        for migration in MIGRATIONS:
            if migration.name in applied:
                continue
            # Inside a transaction sqlite-utils runs the script statement by
            # statement, without sqlite3's implicit COMMIT.
            if migration.sql.strip():
                db.executescript(migration.sql)
            if migration.apply is not None:
                migration.apply(db.conn)
            if migration.check is not None and (bad := db.execute(migration.check).fetchall()):
                raise StoreError(f"migration {migration.name} failed its check ({bad[:3]}); nothing was changed")
            table = "additive_migrations" if migration.additive else "migrations"
            db.execute(f"INSERT INTO {table} (name, applied_at) VALUES (?, ?)", [migration.name, clock()])
            done.append(migration.name)
    return done
