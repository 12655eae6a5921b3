"""The state database's schema: ``MIGRATIONS[i]`` takes a database from version ``i`` to
``i + 1`` (``PRAGMA user_version``); a new database is built by running all of them, so the
path from any older version is the code that builds every database."""
from __future__ import annotations

import functools
import sqlite3

from instances.errors import InputError

# what a damaged state database's refusal tells the operator to do (docs/operators.md)
RESTORE = ("restore it from a backup: stop the service and start it on a copy of the backup (docs/operators.md, "
           "\"Back up and restore\")")

MIGRATIONS: tuple[str, ...] = (
    # v0 -> v1: jobs, their status history, launches
    """
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        spec TEXT NOT NULL,                       -- JobSpec.to_dict() as JSON
        status TEXT NOT NULL,
        submitted_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE job_history (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL REFERENCES jobs(id),
        from_status TEXT,                         -- NULL: submitted
        to_status TEXT NOT NULL,
        reason TEXT NOT NULL,
        at REAL NOT NULL
    );
    CREATE INDEX job_history_job ON job_history(job_id, id);
    CREATE TABLE launches (
        job_id INTEGER NOT NULL REFERENCES jobs(id),
        generation INTEGER NOT NULL,
        plan TEXT NOT NULL,                       -- allocation and parallel plan, JSON
        state TEXT NOT NULL,
        pid_info TEXT,                            -- JSON: mpiexec pid, host, run dir ...
        reason TEXT NOT NULL DEFAULT '',
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (job_id, generation)
    );
    """,
    # v1 -> v2: the GPUs of each launch (one active launch per GPU), rounds, measurements,
    # checkpoints
    """
    CREATE TABLE launch_gpus (
        job_id INTEGER NOT NULL,
        generation INTEGER NOT NULL,
        gpu TEXT NOT NULL,
        active INTEGER NOT NULL,
        FOREIGN KEY (job_id, generation) REFERENCES launches(job_id, generation)
    );
    CREATE UNIQUE INDEX launch_gpus_one_active ON launch_gpus(gpu) WHERE active = 1;
    CREATE TABLE rounds (
        idx INTEGER PRIMARY KEY AUTOINCREMENT,
        at REAL NOT NULL,
        policy TEXT NOT NULL,
        trigger TEXT NOT NULL,
        objective REAL,
        gap REAL,
        solve_time_s REAL NOT NULL,
        decisions TEXT NOT NULL                   -- JSON
    );
    CREATE TABLE measurements (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL,
        generation INTEGER NOT NULL,
        at REAL NOT NULL,
        step INTEGER,
        iteration_time_s REAL,
        reconfig TEXT NOT NULL,                   -- JSON {part: seconds}, e.g. stop, start, load
        FOREIGN KEY (job_id, generation) REFERENCES launches(job_id, generation)
    );
    CREATE INDEX measurements_job ON measurements(job_id, id);
    CREATE TABLE checkpoints (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL,
        generation INTEGER NOT NULL,
        step INTEGER NOT NULL,
        path TEXT NOT NULL,
        at REAL NOT NULL,
        UNIQUE (job_id, generation, step),
        FOREIGN KEY (job_id, generation) REFERENCES launches(job_id, generation)
    );
    """,
    # v2 -> v3: a cancel request is stored (the API commits it; the scheduler carries it out,
    # also after a restart)
    """
    ALTER TABLE jobs ADD COLUMN cancel_requested_at REAL;
    """,
    # v3 -> v4: a submission's idempotency key (a client that got no answer sends the same
    # key again and gets the job it already submitted, not a second one)
    """
    ALTER TABLE jobs ADD COLUMN submit_key TEXT;
    CREATE UNIQUE INDEX jobs_submit_key ON jobs(submit_key) WHERE submit_key IS NOT NULL;
    """,
    # v4 -> v5: nodes an operator took out of service (the scheduler moves their jobs off
    # and places nothing there until they are returned)
    """
    CREATE TABLE drained_nodes (
        node INTEGER PRIMARY KEY,                 -- the cluster's node id
        reason TEXT NOT NULL,
        at REAL NOT NULL
    );
    """,
    # v5 -> v6: the move ledger (engine/core/move_ledger.py): each move of a running job, what
    # the decision expected of it and what it gave
    """
    CREATE TABLE moves (
        job_id INTEGER NOT NULL REFERENCES jobs(id),
        at REAL NOT NULL,
        forced INTEGER NOT NULL,                  -- off a drained node, not a decision
        from_grid TEXT NOT NULL,
        to_grid TEXT NOT NULL,
        rate_before REAL NOT NULL,                -- iterations/s measured before (0: not measured)
        est_rate_before REAL,                     -- the performance model's, old and new grid
        est_rate_after REAL,
        price_s REAL,                             -- the downtime the move was priced at
        iterations_at REAL NOT NULL,
        ended_at REAL,                            -- NULL: the job still runs where this move put it
        end_reason TEXT NOT NULL DEFAULT '',
        iterations_after REAL NOT NULL DEFAULT 0,
        paid_back_s REAL,                         -- from the move until it had paid for itself
        PRIMARY KEY (job_id, at)
    );
    """,
    # v6 -> v7: a hold request (the API commits it; the scheduler stops the job with a
    # checkpoint and sets it aside, also after a restart) and the reason given for it; a
    # priority set after submission (NULL: the submitted spec's; the spec column stays as
    # submitted, which an idempotency key's replay compares against)
    """
    ALTER TABLE jobs ADD COLUMN hold_requested_at REAL;
    ALTER TABLE jobs ADD COLUMN hold_reason TEXT;
    ALTER TABLE jobs ADD COLUMN priority REAL;
    """,
    # v7 -> v8: the shadow policy's counts kept as running totals (updated with each round),
    # so that /metrics and /api/shadow read one row per shadow policy instead of every
    # round's decisions, and old rounds can be deleted (ServiceConfig.keep_rounds)
    """
    CREATE TABLE shadow_totals (
        policy TEXT PRIMARY KEY,
        rounds INTEGER NOT NULL,
        agreeing INTEGER NOT NULL,
        failed INTEGER NOT NULL,
        jobs INTEGER NOT NULL,
        disagreeing INTEGER NOT NULL
    );
    INSERT INTO shadow_totals(policy, rounds, agreeing, failed, jobs, disagreeing)
        SELECT p, COUNT(*), COALESCE(SUM(a), 0), COALESCE(SUM(f), 0), COALESCE(SUM(j), 0), COALESCE(SUM(d), 0)
        FROM (SELECT json_extract(decisions, '$.shadow.policy') AS p,
                     json_extract(decisions, '$.shadow.all_agree') AS a,
                     json_extract(decisions, '$.shadow.error') IS NOT NULL AS f,
                     CASE WHEN json_extract(decisions, '$.shadow.error') IS NULL
                          THEN json_extract(decisions, '$.shadow.jobs') ELSE 0 END AS j,
                     json_extract(decisions, '$.shadow.disagreements') AS d FROM rounds)
        WHERE p IS NOT NULL GROUP BY p;
    """,
    # v8 -> v9: failed runs per node (engine/service/node_health.py), so that the count
    # toward a node's automatic drain survives a restart of the service
    """
    CREATE TABLE node_failures (
        node INTEGER NOT NULL,                    -- the cluster's node id
        job_id INTEGER NOT NULL,
        at REAL NOT NULL                          -- when the run's failure was seen
    );
    CREATE INDEX node_failures_node ON node_failures(node, at);
    """,
    # v9 -> v10: the user who submitted each job (``arena serve --token``/``--tokens-file``;
    # NULL: submitted without a token, or before this version), whose token (or an admin's)
    # a change of the job needs (engine/service/auth.py)
    """
    ALTER TABLE jobs ADD COLUMN submitted_by TEXT;
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Bring the database to ``target``, one migration per transaction; returns the
    version found. Refuses a database newer than this code."""
    found = conn.execute("PRAGMA user_version").fetchone()[0]
    if found > SCHEMA_VERSION:
        raise InputError(f"database schema version {found} is newer than this code's {SCHEMA_VERSION}",
                         field="user_version")
    for v in range(found, target):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for stmt in _statements(MIGRATIONS[v]):
                conn.execute(stmt)
            conn.execute(f"PRAGMA user_version = {v + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return found


def _statements(script: str) -> list[str]:
    """Split a migration into statements (``executescript`` would commit on its own)."""
    out, buf = [], []
    for line in script.splitlines():
        buf.append(line.split("--", 1)[0])
        stmt = "\n".join(buf).strip()
        if stmt.endswith(";") and sqlite3.complete_statement(stmt):
            out.append(stmt)
            buf = []
    if "\n".join(buf).strip():
        raise ValueError("migration ends inside a statement")
    return out


@functools.lru_cache(maxsize=1)
def expected_schema() -> dict[str, frozenset[str]]:
    """What a database of ``SCHEMA_VERSION`` holds, as built by ``MIGRATIONS``: each table's
    columns (``table``) and each index (``index:NAME``, no columns)."""
    conn = sqlite3.connect(":memory:")
    try:
        migrate(conn)
        return _schema(conn)
    finally:
        conn.close()


def _schema(conn: sqlite3.Connection) -> dict[str, frozenset[str]]:
    out: dict[str, frozenset[str]] = {}
    for kind, name in conn.execute("SELECT type, name FROM sqlite_master WHERE type IN ('table', 'index') "
                                   "AND name NOT LIKE 'sqlite_%'"):
        if kind == "index":
            out[f"index:{name}"] = frozenset()
        else:
            out[name] = frozenset(r[1] for r in conn.execute(f"PRAGMA table_info({_quoted(name)})"))
    return out


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def missing_schema(conn: sqlite3.Connection) -> list[str]:
    """The tables, columns and indexes of this version's schema that the database lacks
    (a table dropped or an index removed by hand leaves ``user_version`` as it was), in
    words: ``table 'moves'``, ``column 'jobs.priority'``, ``index 'launch_gpus_one_active'``."""
    have = _schema(conn)
    out = []
    for name, cols in expected_schema().items():
        if name not in have:
            out.append(f"index {name.removeprefix('index:')!r}" if name.startswith("index:") else f"table {name!r}")
        else:
            out += [f"column '{name}.{c}'" for c in sorted(cols - have[name])]
    return out
