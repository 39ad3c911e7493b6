"""Opening the store's SQLite file: checks, pragmas, migrations, transactions.

Several omnigent processes may share one file (a server, a second
`omnigent run --continue`, a host daemon), so the connection rules live here in
one place: WAL, `synchronous=NORMAL`, temporary files in memory, a 5 s busy timeout, foreign keys on,
legacy transaction control (sqlite-utils 4 rejects `autocommit=` connections)
and `BEGIN IMMEDIATE` for every read-then-write. A deferred read lock that is
later upgraded fails with SQLITE_BUSY without waiting (stack-notes section 6).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..config.dirs import DiskError, describe, private_dir, private_file, tighten
from .errors import StoreError
from .search import create_search_index
from .search import reconcile as reconcile_search_index

if TYPE_CHECKING:
    import sqlite_utils  # imported when a store is opened: ~55 ms a cold start can overlap

BUSY_TIMEOUT_S = 5.0
MEMORY = ":memory:"
SQLITE_MAGIC = b"SQLite format 3\x00"
# SQLite gives these the database file's mode, but ones left by an older
# release may be looser: they are tightened with it.
COMPANIONS = ("-wal", "-shm", "-journal")


@dataclass(frozen=True)
class Migration:
    """One named schema change.

    `additive` migrations only add tables, indexes and nullable or defaulted
    columns, so a process of an older release can keep using the file: they
    are recorded in `additive_migrations`, which older releases never read
    (release 0.1.0 refuses any name it does not know in `migrations`), and an
    unknown name there is tolerated. A migration that older code could not
    live with goes into `migrations`, where an unknown name makes every older
    release refuse the file with one line.
    """

    name: str
    sql: str
    additive: bool = False
    # a query run after `sql`, in the same transaction, that must return no rows (else the
    # migration is rolled back): `PRAGMA foreign_key_check` after a table rebuild
    check: str | None = None
    # work SQL alone cannot say, run after `sql` in the same transaction (0010: whether this
    # SQLite has FTS5, and a backfill that reports its progress)
    apply: Callable[[sqlite3.Connection], None] | None = None


# Append only: a migration, once released, is never edited or reordered.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        "0001_initial",
        """
        CREATE TABLE agents (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            spec TEXT NOT NULL DEFAULT '{}',
            bundle BLOB,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );
        CREATE UNIQUE INDEX idx_agents_name ON agents (name);

        CREATE TABLE conversations (
            id TEXT PRIMARY KEY,
            kind SMALLINT NOT NULL DEFAULT 1 CHECK (kind IN (1, 2)),
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            title TEXT NOT NULL DEFAULT '',
            agent_id TEXT REFERENCES agents (id),
            runner_id TEXT,
            reasoning_effort TEXT,
            model_override TEXT,
            workspace TEXT,
            next_position INTEGER NOT NULL DEFAULT 0
        );
        -- id as second column: listing order is (ts, id), so the index serves ORDER BY fully
        CREATE INDEX idx_conversations_updated_at ON conversations (updated_at, id);
        CREATE INDEX idx_conversations_created_at ON conversations (created_at, id);
        -- per-agent listings (`--continue`) stay index-ordered too
        CREATE INDEX idx_conversations_agent_updated_at ON conversations (agent_id, updated_at, id);
        CREATE INDEX idx_conversations_agent_created_at ON conversations (agent_id, created_at, id);
        CREATE INDEX idx_conversations_runner_id ON conversations (runner_id);

        CREATE TABLE conversation_items (
            id TEXT NOT NULL,
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            turn_id TEXT,
            response_id TEXT,
            output_index INTEGER,
            position INTEGER NOT NULL,
            type TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'completed'
                CHECK (status IN ('completed', 'in_progress', 'incomplete', 'failed')),
            role TEXT,
            data TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (conversation_id, id)
        );
        CREATE UNIQUE INDEX idx_items_position ON conversation_items (conversation_id, position);
        -- backstop for exactly-once turn output: one row per (turn, output slot)
        CREATE UNIQUE INDEX idx_items_turn_output
            ON conversation_items (conversation_id, turn_id, output_index)
            WHERE turn_id IS NOT NULL AND output_index IS NOT NULL;

        CREATE TABLE turns (
            id TEXT PRIMARY KEY,
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            input_item_id TEXT,
            status TEXT NOT NULL DEFAULT 'queued'
                CHECK (status IN ('queued', 'running', 'completed', 'failed', 'interrupted', 'cancelled')),
            attempt INTEGER NOT NULL DEFAULT 0,
            runner_id TEXT,
            owner_pid INTEGER,
            error TEXT,
            created_at REAL NOT NULL,
            started_at REAL,
            ended_at REAL
        );
        CREATE INDEX idx_turns_conversation ON turns (conversation_id, created_at);
        CREATE INDEX idx_turns_status ON turns (status);
        CREATE INDEX idx_turns_runner_id ON turns (runner_id);

        -- the claim that makes a turn's output land once, even when it is empty
        CREATE TABLE turn_outputs (
            turn_id TEXT PRIMARY KEY,
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            response_id TEXT,
            item_count INTEGER NOT NULL,
            created_at REAL NOT NULL
        );

        CREATE TABLE files (
            id TEXT PRIMARY KEY,
            conversation_id TEXT REFERENCES conversations (id) ON DELETE CASCADE,
            filename TEXT NOT NULL,
            bytes INTEGER NOT NULL,
            content_type TEXT,
            data BLOB,
            created_at REAL NOT NULL
        );
        CREATE INDEX idx_files_conversation ON files (conversation_id, created_at);
        """,
    ),
    Migration(
        "0002_runner_credentials",
        """
        -- one secret per runner id, bound by whoever launched it; only its sha256 is kept
        CREATE TABLE runner_credentials (
            runner_id TEXT PRIMARY KEY,
            secret_hash TEXT NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('host', 'explicit')),
            host_id TEXT,
            created_at REAL NOT NULL,
            revoked_at REAL
        );
        CREATE INDEX idx_runner_credentials_revoked_at ON runner_credentials (revoked_at);
        """,
        additive=True,
    ),
    Migration(
        "0003_conversation_claims",
        """
        -- one turn at a time per conversation, across processes: the holder's identity
        -- (pid + /proc start time, so a reused pid is not mistaken for it) and a lease
        CREATE TABLE conversation_claims (
            conversation_id TEXT PRIMARY KEY REFERENCES conversations (id) ON DELETE CASCADE,
            turn_id TEXT,
            owner_pid INTEGER NOT NULL,
            owner_started TEXT NOT NULL,
            owner_token TEXT NOT NULL,
            lease_until REAL NOT NULL,
            claimed_at REAL NOT NULL
        );
        -- a user message posted while the conversation is busy: it joins the items
        -- when its turn holds the claim, so it lands after the answer it waited for
        CREATE TABLE pending_items (
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            id TEXT NOT NULL,
            data TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (conversation_id, id)
        );
        """,
        additive=True,
    ),
    Migration(
        "0004_hosts",
        """
        -- registered host daemons: only the sha256 of each host's secret is kept;
        -- `generation` counts the links the server accepted for it (ownership)
        CREATE TABLE hosts (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL DEFAULT '',
            secret_hash TEXT NOT NULL,
            workspace_roots TEXT NOT NULL DEFAULT '[]',
            capacity INTEGER NOT NULL DEFAULT 0,
            generation INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL,
            last_seen_at REAL,
            revoked_at REAL
        );
        -- the host a session belongs to (its workspace is a directory on that machine)
        ALTER TABLE conversations ADD COLUMN host_id TEXT;
        """,
        additive=True,
    ),
    Migration(
        "0005_session_events",
        """
        -- every event a session's watchers see, numbered per session (server/hub.py)
        CREATE TABLE session_events (
            conversation_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            type TEXT NOT NULL,
            data TEXT NOT NULL,
            created_at REAL NOT NULL,
            turn_id TEXT,
            PRIMARY KEY (conversation_id, seq)
        );
        -- compaction drops the text deltas of old turns by turn
        CREATE INDEX idx_session_events_turn ON session_events (conversation_id, turn_id)
            WHERE turn_id IS NOT NULL;
        -- the lowest cursor the log can still serve in full; below it a watcher gets a resync.
        -- Sessions older than the log have history it never saw: their floor is 1.
        CREATE TABLE session_event_floors (
            conversation_id TEXT PRIMARY KEY,
            floor INTEGER NOT NULL
        );
        INSERT INTO session_event_floors (conversation_id, floor) SELECT id, 1 FROM conversations;
        """,
        additive=True,
    ),
    Migration(
        "0006_ownership",
        """
        -- bumped on every (re)binding of the session to a runner: a runner that comes
        -- back with a turn of an older generation is refused (server/turns.py)
        ALTER TABLE conversations ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
        -- the session's generation the turn's current attempt was dispatched under
        ALTER TABLE turns ADD COLUMN generation INTEGER;
        -- the agent spec a session runs with, pinned when it is created: an upload of
        -- the same agent name by another client never changes it. Sessions of an
        -- older release are pinned here to the spec they ran with; one created by an
        -- older process afterwards reads the named row until it is pinned.
        CREATE TABLE session_agents (
            conversation_id TEXT PRIMARY KEY REFERENCES conversations (id) ON DELETE CASCADE,
            spec TEXT NOT NULL DEFAULT '{}',
            bundle BLOB,
            updated_at REAL NOT NULL
        );
        INSERT INTO session_agents (conversation_id, spec, bundle, updated_at)
            SELECT c.id, a.spec, NULL, a.updated_at FROM conversations c JOIN agents a ON a.id = c.agent_id;
        """,
        additive=True,
    ),
    Migration(
        "0007_agent_steps",
        """
        -- the steps of a turn (issue 9): a model step is one request to the model, a tool step
        -- one tool call; each is stored before the next is taken, so a turn resumes from the
        -- first unfinished one. No foreign key names `turns` (0008 rebuilds that table, and a
        -- reference to it would cascade on the rebuild's DROP).
        CREATE TABLE turn_steps (
            turn_id TEXT NOT NULL,
            step INTEGER NOT NULL,
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            kind TEXT NOT NULL CHECK (kind IN ('model', 'tool')),
            status TEXT NOT NULL DEFAULT 'running' CHECK (status IN
                ('running', 'waiting', 'completed', 'failed', 'interrupted', 'cancelled', 'not_run')),
            call_id TEXT,
            tool TEXT,
            arguments TEXT,
            attempt INTEGER NOT NULL DEFAULT 0,
            usage TEXT,
            error TEXT,
            started_at REAL NOT NULL,
            ended_at REAL,
            PRIMARY KEY (turn_id, step)
        );
        CREATE INDEX idx_turn_steps_conversation ON turn_steps (conversation_id, turn_id);
        -- a side-effecting call waiting for a user's answer; answered once (first answer wins)
        CREATE TABLE approvals (
            id TEXT PRIMARY KEY,
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            turn_id TEXT NOT NULL,
            step INTEGER NOT NULL,
            call_id TEXT,
            tool TEXT NOT NULL,
            arguments TEXT,
            target TEXT NOT NULL DEFAULT '',
            diff TEXT,
            status TEXT NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'allowed', 'denied', 'expired', 'cancelled')),
            decision TEXT,
            decided_by TEXT,
            created_at REAL NOT NULL,
            decided_at REAL,
            expires_at REAL
        );
        CREATE INDEX idx_approvals_conversation ON approvals (conversation_id, status, created_at);
        -- "always": this tool with this exact target (command or path), for this session
        CREATE TABLE approval_rules (
            id TEXT PRIMARY KEY,
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            tool TEXT NOT NULL,
            target TEXT NOT NULL,
            created_at REAL NOT NULL,
            UNIQUE (conversation_id, tool, target)
        );
        -- JSON usage summed over the turn's model steps
        ALTER TABLE turns ADD COLUMN usage TEXT;
        -- seconds an approval of this turn waits for an answer; NULL: until answered
        ALTER TABLE turns ADD COLUMN approval_timeout REAL;
        -- ask | auto | deny; NULL: the agent spec's own
        ALTER TABLE conversations ADD COLUMN permission_mode TEXT;
        """,
        additive=True,
    ),
    Migration(
        "0008_item_and_turn_statuses",
        # SQLite cannot change a CHECK constraint in place: the tables are rebuilt with the
        # procedure of sqlite.org/lang_altertable.html#otheralter, inside the migration's
        # transaction. `PRAGMA foreign_keys` cannot be switched off inside a transaction, so
        # instead: both tables are only children in foreign keys (nothing references them, so
        # the DROPs delete no other row and fire no ON DELETE CASCADE), checks are deferred to
        # the commit, and `foreign_key_check` verifies the result. Same columns in the same
        # order, rowids kept (turns are listed by created_at, rowid), every index recreated.
        # Old code keeps working: the new statuses are only ever written by new code.
        """
        PRAGMA defer_foreign_keys = ON;

        CREATE TABLE conversation_items_new (
            id TEXT NOT NULL,
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            turn_id TEXT,
            response_id TEXT,
            output_index INTEGER,
            position INTEGER NOT NULL,
            type TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'completed'
                CHECK (status IN ('completed', 'in_progress', 'incomplete', 'failed',
                                  'interrupted', 'cancelled', 'not_run')),
            role TEXT,
            data TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (conversation_id, id)
        );
        INSERT INTO conversation_items_new (rowid, id, conversation_id, turn_id, response_id, output_index,
                                            position, type, status, role, data, created_at)
            SELECT rowid, id, conversation_id, turn_id, response_id, output_index,
                   position, type, status, role, data, created_at FROM conversation_items;
        DROP TABLE conversation_items;
        ALTER TABLE conversation_items_new RENAME TO conversation_items;
        CREATE UNIQUE INDEX idx_items_position ON conversation_items (conversation_id, position);
        -- backstop for exactly-once turn output: one row per (turn, output slot)
        CREATE UNIQUE INDEX idx_items_turn_output
            ON conversation_items (conversation_id, turn_id, output_index)
            WHERE turn_id IS NOT NULL AND output_index IS NOT NULL;

        CREATE TABLE turns_new (
            id TEXT PRIMARY KEY,
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            input_item_id TEXT,
            status TEXT NOT NULL DEFAULT 'queued'
                CHECK (status IN ('queued', 'running', 'waiting', 'completed', 'failed', 'interrupted',
                                  'cancelled')),
            attempt INTEGER NOT NULL DEFAULT 0,
            runner_id TEXT,
            owner_pid INTEGER,
            error TEXT,
            created_at REAL NOT NULL,
            started_at REAL,
            ended_at REAL,
            generation INTEGER,
            usage TEXT,
            approval_timeout REAL
        );
        INSERT INTO turns_new (rowid, id, conversation_id, input_item_id, status, attempt, runner_id, owner_pid,
                               error, created_at, started_at, ended_at, generation, usage, approval_timeout)
            SELECT rowid, id, conversation_id, input_item_id, status, attempt, runner_id, owner_pid,
                   error, created_at, started_at, ended_at, generation, usage, approval_timeout FROM turns;
        DROP TABLE turns;
        ALTER TABLE turns_new RENAME TO turns;
        CREATE INDEX idx_turns_conversation ON turns (conversation_id, created_at);
        CREATE INDEX idx_turns_status ON turns (status);
        CREATE INDEX idx_turns_runner_id ON turns (runner_id);
        """,
        additive=True,
        check="PRAGMA foreign_key_check",
    ),
    Migration(
        "0009_conversation_forks",
        """
        -- a fork (store/catalog.py): the conversation it was copied from, and the last item
        -- copied (NULL: all of them). Plain ids, no foreign key: deleting the source keeps
        -- the fork, which still says where it came from.
        ALTER TABLE conversations ADD COLUMN forked_from TEXT;
        ALTER TABLE conversations ADD COLUMN forked_at_item TEXT;
        """,
        additive=True,
    ),
    Migration(
        # full-text search over the text of user and assistant messages (store/search.py): an
        # FTS5 table kept in step by triggers on `conversation_items`, backfilled here. Where
        # this SQLite has no FTS5 it is recorded with no table, and search uses LIKE.
        "0010_items_fts",
        "",
        additive=True,
        apply=create_search_index,
    ),
    Migration(
        "0011_turn_cancel_requests",
        """
        -- a cancel asked for by another process (`omnigent sessions rm` on the local store):
        -- the process running the turn sees it at its next claim renewal and cancels the
        -- turn through its own dispatcher (server/claims.py), as an interrupt would
        ALTER TABLE turns ADD COLUMN cancel_requested_at REAL;
        """,
        additive=True,
    ),
)


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
