"""The store's schema history: every migration, in the order it is applied.

A store file records the names of the migrations applied to it, and releases
judge each other's files by those names (`db.py` refuses a file with a strict
name it does not know), so this list is append only: a released migration is
never edited, renamed or reordered, and its SQL stays byte for byte what it was
(the checked-in stores of earlier releases depend on it). A schema change is a
new, named migration appended at the end with the next free number. Applying
them, in one transaction with the checks, is `db.migrate`'s work.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from .search import create_search_index, index_in_batches


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
    Migration(
        "0012_turns_by_status",
        """
        -- a session's open turns without walking its ended ones: whether it is busy (every
        -- message), its next queued turn (every dispatch) and its running one read this in
        -- O(1) instead of O(turns), so a turn costs the same in a long conversation
        CREATE INDEX idx_turns_conversation_status ON turns (conversation_id, status, created_at);
        """,
        additive=True,
    ),
    Migration(
        # the search index in batches (store/search.py): the triggers only queue a new or
        # changed message (its `search_rows` row); its FTS row is written by `index_pending`,
        # before every search and every few seconds by the server, not inside every turn's
        # transaction. No data changes; without FTS5 there is nothing to change.
        "0013_search_index_in_batches",
        "",
        additive=True,
        apply=index_in_batches,
    ),
)
