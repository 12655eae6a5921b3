"""The service's state in SQLite (stdlib ``sqlite3``): jobs and their status history,
launches (one generation number per launch of a job), rounds and their decisions,
measured iteration and reconfiguration times, checkpoints.

Crash safety rests on three rules:

- every method that changes state is one transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``,
  ``synchronous=FULL``), committed before it returns: the caller writes the intent, then
  acts, then records the outcome, so after a crash the database tells what was decided
  and what is known to have happened (a launch in state ``intent`` may or may not have
  started; its pids say which);
- the rules of the state machine are checked inside that transaction (job status
  transitions; one active launch per job; only a job's latest launch generation may
  change launch state or record checkpoints: a late message from an old launch is
  refused with ``StaleGeneration``);
- a GPU can be in only one active launch: a partial unique index enforces it in the
  database itself.

Concurrency: WAL journal; one writer process (the service), any number of readers in
other processes (``Store(path, readonly=True)``, e.g. the CLI) that see only committed
state and do not block the writer.

Schema versions live in ``PRAGMA user_version``; ``MIGRATIONS[i]`` takes a database from
version ``i`` to ``i + 1``, and a new database is built by running all of them, so the
path from any older version is the code that builds every database.
"""
from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from instances.errors import InputError
from instances.limits import check_priority

from .auth import USER_RE
from .jobspec import JobSpec

JOB_STATUSES = ("queued", "running", "held", "finished", "failed", "cancelled")
TERMINAL = frozenset({"finished", "failed", "cancelled"})
TRANSITIONS = {
    # queued -> finished: a job whose last launch completed its training as it was being
    # stopped (a preemption or a move decided at its last step)
    "queued": frozenset({"running", "held", "cancelled", "failed", "finished"}),
    "running": frozenset({"queued", "finished", "failed", "cancelled"}),   # queued: preempted
    # held: set aside by a user (a running job is stopped with a checkpoint first, so it
    # is held from the queue); released back to the queue, or cancelled
    "held": frozenset({"queued", "cancelled"}),
    "finished": frozenset(), "failed": frozenset(), "cancelled": frozenset(),
}
LAUNCH_STATES = ("intent", "started", "finished", "failed")
ACTIVE_LAUNCH = frozenset({"intent", "started"})
LAUNCH_TRANSITIONS = {
    "intent": frozenset({"started", "failed"}),        # failed: it never started
    "started": frozenset({"finished", "failed"}),
    "finished": frozenset(), "failed": frozenset(),
}
BUSY_TIMEOUT_MS = 10_000
MAX_KEY_CHARS = 200          # a submission's idempotency key


class StateConflict(ValueError):
    """A change the state machine does not allow now (e.g. cancelling a finished job)."""


class StaleGeneration(StateConflict):
    """A message from a launch that is no longer the job's latest."""


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


@dataclass(frozen=True)
class JobRow:
    id: int
    name: str
    spec: dict                  # JobSpec.to_dict(); JobSpec.from_dict(spec) re-validates it
    status: str
    submitted_at: float
    updated_at: float
    submitted_by: str | None = None     # the user whose token submitted it (None: no token)


@dataclass(frozen=True)
class HistoryRow:
    job_id: int
    from_status: str | None
    to_status: str
    reason: str
    at: float


@dataclass(frozen=True)
class LaunchRow:
    job_id: int
    generation: int
    plan: dict
    gpus: tuple[str, ...]
    state: str
    pid_info: dict | None
    reason: str
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class RoundRow:
    idx: int
    at: float
    policy: str
    trigger: str
    objective: float | None
    gap: float | None
    solve_time_s: float
    decisions: dict


@dataclass(frozen=True)
class MeasurementRow:
    job_id: int
    generation: int
    at: float
    step: int | None
    iteration_time_s: float | None
    reconfig: dict


@dataclass(frozen=True)
class CheckpointRow:
    job_id: int
    generation: int
    step: int
    path: str
    at: float


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


def _id_chunks(ids: Iterable[int], size: int = 900) -> Iterator[tuple[list[int], str]]:
    """Distinct ids in ascending order, in parts under SQLite's limit on a statement's
    parameters (999 before 3.32), each with its ``?, ?, ...`` placeholders."""
    want = sorted({int(i) for i in ids})
    for k in range(0, len(want), size):
        part = want[k:k + size]
        yield part, ", ".join("?" * len(part))


def _dumps(value, field: str) -> str:
    try:
        return json.dumps(value, allow_nan=False, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise InputError(f"not storable as JSON: {e}", field=field) from None


def _finite(value, field: str, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    try:
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    except OverflowError:                           # an integer past float's range
        ok = False
    if not ok:
        raise InputError(f"must be a finite number, got {value!r}", field=field)
    return float(value)


class Store:
    """One connection to the state database. ``readonly``: a reader in another process."""

    def __init__(self, path: str | Path, *, readonly: bool = False, clock: Callable[[], float] = time.time):
        self.path, self.readonly, self.clock = Path(path), readonly, clock
        if self.path.is_dir():
            raise InputError("is a folder, not a database file", file=str(self.path))
        if readonly and not self.path.is_file():
            raise InputError("no state database here (has the service run?)", file=str(self.path))
        uri = f"file:{self.path.resolve()}{'?mode=ro' if readonly else ''}"
        # check_same_thread=False: the service builds its store, then its scheduler thread alone uses it
        self.conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000,
                                    check_same_thread=False)
        try:
            self.conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            if readonly:
                v = self.conn.execute("PRAGMA user_version").fetchone()[0]
                if v != SCHEMA_VERSION:
                    raise InputError(f"schema version {v}; this code reads {SCHEMA_VERSION} (start the service "
                                     "once to migrate)", file=str(self.path), field="user_version")
            else:
                self.conn.execute("PRAGMA journal_mode = WAL")
                self.conn.execute("PRAGMA synchronous = FULL")
                self.conn.execute("PRAGMA foreign_keys = ON")
                migrate(self.conn)
        except sqlite3.DatabaseError as e:
            self.conn.close()
            raise InputError(f"not a usable SQLite database: {e}", file=str(self.path)) from None
        except BaseException:
            self.conn.close()
            raise

    def close(self) -> None:
        self.conn.close()

    def backup(self, dest: str | Path) -> Path:
        """A consistent copy of the database at ``dest``, taken while the service may be
        writing (SQLite's online backup: one step, under a read transaction, so the copy is
        one committed state), written beside ``dest`` and renamed into place only once it
        passes ``check()``. ``dest`` must not exist. Returns ``dest``."""
        dest = Path(dest)
        if dest.exists():
            raise InputError("already exists; a backup does not overwrite", file=str(dest))
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
        tmp.unlink(missing_ok=True)
        try:
            out = sqlite3.connect(str(tmp))
            try:
                self.conn.backup(out)
                out.execute("PRAGMA journal_mode = DELETE")     # a single file, whatever the source used
            finally:
                out.close()
            with Store(tmp, readonly=True) as copy:
                problems = copy.check()
            if problems:
                raise StateConflict("the copy is inconsistent: " + "; ".join(problems[:5]))
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        return dest

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[float]:
        """One write transaction holding the write lock; yields the time of the change
        (taken under the lock, so times are in commit order for one clock)."""
        if self.readonly:
            raise StateConflict("this store was opened read-only")
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.clock()
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise

    # ---- jobs -------------------------------------------------------------------------

    def submit(self, spec: JobSpec, reason: str = "submitted", *, user: str | None = None) -> int:
        """Store a validated job as ``queued`` (``user``: who submitted it); returns its id."""
        return self.submit_once(spec, None, reason, user=user)[0]

    def submit_once(self, spec: JobSpec, key: str | None, reason: str = "submitted", *,
                    user: str | None = None) -> tuple[int, bool]:
        """``submit`` with an idempotency key: the job already stored under ``key`` comes
        back (``(id, False)``) instead of a second one; the same key with another job, or
        from another user, is a ``StateConflict``. ``key=None``: always a new job.
        ``user``: who submits it (None: no token). Returns ``(id, stored now)``."""
        if not isinstance(spec, JobSpec):
            raise InputError("submit takes a JobSpec (validated)", field="spec")
        if key is not None and not (isinstance(key, str) and 0 < len(key) <= MAX_KEY_CHARS
                                    and key.isprintable()):
            raise InputError(f"an idempotency key is 1-{MAX_KEY_CHARS} printable characters, got {key!r}",
                             field="Idempotency-Key")
        if user is not None and not (isinstance(user, str) and USER_RE.match(user)):
            raise InputError(f"a user name is 1-64 letters, digits, '.', '_' or '-', got {user!r}", field="user")
        body = _dumps(spec.to_dict(), "spec")
        with self._tx() as now:
            for dep in spec.after:               # checked with the insert: no dependency ends in between
                row = self.conn.execute("SELECT status FROM jobs WHERE id = ?", (dep,)).fetchone()
                if row is None:
                    raise InputError(f"no job {dep} to run after", field="after")
                if row[0] in ("failed", "cancelled"):
                    raise InputError(f"job {dep} is {row[0]}: a job after it would never start", field="after")
            if key is not None:
                had = self.conn.execute("SELECT id, spec, submitted_by FROM jobs WHERE submit_key = ?",
                                        (key,)).fetchone()
                if had is not None:
                    if had[2] != user:
                        raise StateConflict(f"idempotency key {key!r} was used by another user; use a new key")
                    if had[1] != body:
                        raise StateConflict(f"idempotency key {key!r} was used for job {had[0]}, "
                                            "a different job; use a new key for a new job")
                    return int(had[0]), False
            cur = self.conn.execute(
                "INSERT INTO jobs(name, spec, status, submitted_at, updated_at, submit_key, submitted_by) "
                "VALUES (?, ?, 'queued', ?, ?, ?, ?)", (spec.name, body, now, now, key, user))
            job_id = int(cur.lastrowid or 0)
            self._history(job_id, None, "queued", reason, now)
        return job_id, True

    def set_status(self, job_id: int, status: str, reason: str) -> None:
        """Move a job along an allowed transition (``TRANSITIONS``). Leaving ``running`` for
        another status needs the job's launch ended first (``mark_launch``); entering
        ``running`` needs its latest launch ``started``."""
        if status not in JOB_STATUSES:
            raise InputError(f"unknown status {status!r}; known: {', '.join(JOB_STATUSES)}", field="status")
        with self._tx() as now:
            cur = self._job_status(job_id)
            if status not in TRANSITIONS[cur]:
                raise StateConflict(f"job {job_id}: {cur} -> {status} is not allowed")
            latest = self._latest_launch(job_id)
            if status == "running" and (latest is None or latest[1] != "started"):
                raise StateConflict(f"job {job_id}: running needs a started launch")
            if status != "running" and latest is not None and latest[1] in ACTIVE_LAUNCH:
                raise StateConflict(f"job {job_id}: launch {latest[0]} is still {latest[1]}; end it first")
            self.conn.execute("UPDATE jobs SET status = ?, updated_at = ? WHERE id = ?", (status, now, job_id))
            self._history(job_id, cur, status, reason, now)

    def request_cancel(self, job_id: int) -> bool:
        """Record that the user asked to cancel the job (the scheduler stops it, with a
        checkpoint, and marks it cancelled). False if it has already ended."""
        with self._tx() as now:
            if self._job_status(job_id) in TERMINAL:
                return False
            self.conn.execute("UPDATE jobs SET cancel_requested_at = COALESCE(cancel_requested_at, ?), "
                              "updated_at = ? WHERE id = ?", (now, now, job_id))
        return True

    def request_hold(self, job_id: int, reason: str) -> bool:
        """Record that a user asked to set the job aside (the scheduler stops a running one
        with a checkpoint and holds it until ``release``). False if it already is held or
        a hold is already requested (the first reason is kept); a job that has ended
        cannot be held."""
        with self._tx() as now:
            cur = self._job_status(job_id)
            if cur in TERMINAL:
                raise StateConflict(f"job {job_id} is {cur}; only a queued or running job can be held")
            if cur == "held":
                return False
            changed = self.conn.execute(
                "UPDATE jobs SET hold_requested_at = ?, hold_reason = ?, updated_at = ? "
                "WHERE id = ? AND hold_requested_at IS NULL", (now, str(reason)[:500], now, job_id)).rowcount
        return changed == 1

    def hold_requests(self) -> list[tuple[int, str]]:
        """Jobs (id, reason) whose hold was requested and not yet carried out."""
        return [(int(i), str(r)) for i, r in self.conn.execute(
            "SELECT id, COALESCE(hold_reason, '') FROM jobs WHERE hold_requested_at IS NOT NULL "
            "AND status IN ('queued', 'running') ORDER BY id")]

    def hold(self, job_id: int) -> bool:
        """Carry out a requested hold on a queued job (the scheduler stopped it if it ran):
        held, with the request's reason, and the request cleared, in one transaction.
        False if the request was withdrawn meanwhile (``release`` before it was carried out)."""
        with self._tx() as now:
            cur = self._job_status(job_id)
            requested, reason = self.conn.execute("SELECT hold_requested_at, hold_reason FROM jobs WHERE id = ?",
                                                  (job_id,)).fetchone()
            if requested is None:
                return False
            if cur != "queued":
                raise StateConflict(f"job {job_id}: {cur} -> held is not allowed (a running job is stopped first)")
            self.conn.execute("UPDATE jobs SET status = 'held', hold_requested_at = NULL, updated_at = ? "
                              "WHERE id = ?", (now, job_id))
            self._history(job_id, cur, "held", f"held by the user: {reason}" if reason else "held by the user", now)
        return True

    def release(self, job_id: int) -> str:
        """A user's release: a held job goes back to the queue (``"released"``); a hold
        not yet carried out is withdrawn (``"withdrawn"``). Any other job: ``StateConflict``."""
        with self._tx() as now:
            cur = self._job_status(job_id)
            if cur == "held":
                self.conn.execute("UPDATE jobs SET status = 'queued', hold_reason = NULL, updated_at = ? "
                                  "WHERE id = ?", (now, job_id))
                self._history(job_id, cur, "queued", "released by the user", now)
                return "released"
            withdrawn = self.conn.execute(
                "UPDATE jobs SET hold_requested_at = NULL, hold_reason = NULL, updated_at = ? "
                "WHERE id = ? AND hold_requested_at IS NOT NULL AND status IN ('queued', 'running')",
                (now, job_id)).rowcount
            if not withdrawn:
                raise StateConflict(f"job {job_id} is {cur}, not held; only a held job can be released")
        return "withdrawn"

    def set_priority(self, job_id: int, priority: float, reason: str = "") -> float:
        """A user's change of a job's priority (queued, running or held; the scheduler
        reads it at its next round): stored beside the submitted spec, with a note in the
        job's history (from and to its status). Returns the priority it had."""
        priority = check_priority(priority)
        with self._tx() as now:
            cur = self._job_status(job_id)
            if cur in TERMINAL:
                raise StateConflict(f"job {job_id} is {cur}; only a queued, running or held job's priority can change")
            spec, prio = self.conn.execute("SELECT spec, priority FROM jobs WHERE id = ?", (job_id,)).fetchone()
            was = float(prio if prio is not None else json.loads(spec)["priority"])
            self.conn.execute("UPDATE jobs SET priority = ?, updated_at = ? WHERE id = ?",
                              (float(priority), now, job_id))
            self._history(job_id, cur, cur, f"priority {was:g} -> {float(priority):g} by the user"
                          + (f": {str(reason)[:500]}" if reason else ""), now)
        return was

    def statuses(self, job_ids) -> dict[int, str]:
        """The status of each of ``job_ids`` that exists."""
        out: dict[int, str] = {}
        for part, marks in _id_chunks(job_ids):
            out.update((int(i), str(st)) for i, st in self.conn.execute(
                f"SELECT id, status FROM jobs WHERE id IN ({marks})", part))
        return out

    def priorities_set(self) -> dict[int, float]:
        """Priorities set since submission, of the jobs that have not ended (id -> priority)."""
        return {int(i): float(p) for i, p in self.conn.execute(
            "SELECT id, priority FROM jobs WHERE priority IS NOT NULL AND status IN ('queued', 'running', 'held')")}

    def drain(self, node: int, reason: str) -> bool:
        """Take a node out of service (its jobs are moved off by the scheduler); False if it
        already was (its first reason is kept)."""
        if not (isinstance(node, int) and not isinstance(node, bool) and node >= 0):
            raise InputError(f"a node id is an integer >= 0, got {node!r}", field="node")
        with self._tx() as now:
            cur = self.conn.execute("INSERT OR IGNORE INTO drained_nodes(node, reason, at) VALUES (?, ?, ?)",
                                    (node, str(reason)[:500], now))
        return cur.rowcount == 1

    def undrain(self, node: int) -> bool:
        """Return a node to service; False if it was not drained."""
        with self._tx():
            cur = self.conn.execute("DELETE FROM drained_nodes WHERE node = ?", (node,))
        return cur.rowcount == 1

    def drained(self) -> dict[int, tuple[str, float]]:
        """Drained nodes: node id -> (reason, when)."""
        rows = self.conn.execute("SELECT node, reason, at FROM drained_nodes ORDER BY node")
        return {n: (r, at) for n, r, at in rows}

    def record_node_failure(self, nodes: Iterable[int], job_id: int, at: float, forget_before: float) -> None:
        """A run of ``job_id`` failed on ``nodes`` at ``at``; failures before
        ``forget_before`` (outside the window) are deleted in the same transaction."""
        with self._tx():
            self.conn.execute("DELETE FROM node_failures WHERE at < ?", (float(forget_before),))
            self.conn.executemany("INSERT INTO node_failures(node, job_id, at) VALUES (?, ?, ?)",
                                  [(int(n), int(job_id), float(at)) for n in sorted(set(nodes))])

    def node_failures(self, since: float) -> list[tuple[int, int, float]]:
        """Failed runs at or after ``since``: (node, job id, when), oldest first."""
        return [(int(n), int(j), float(a)) for n, j, a in self.conn.execute(
            "SELECT node, job_id, at FROM node_failures WHERE at >= ? ORDER BY at, rowid", (float(since),))]

    def clear_node_failures(self, node: int) -> None:
        """The node's failed runs are forgotten (it is back in service)."""
        with self._tx():
            self.conn.execute("DELETE FROM node_failures WHERE node = ?", (int(node),))

    MOVE_FIELDS = ("job_id", "at", "forced", "from_grid", "to_grid", "rate_before", "est_rate_before",
                   "est_rate_after", "price_s", "iterations_at", "ended_at", "end_reason", "iterations_after",
                   "paid_back_s")

    def record_moves(self, entries: Iterable[Any]) -> None:
        """Insert or update move-ledger entries (``engine.core.move_ledger.MoveEntry``) in one
        transaction: a new move, or what an open one has made since (its end, progress,
        payback)."""
        rows = [(int(e.job_id), float(e.time_s), int(bool(e.forced)), str(e.from_grid), str(e.to_grid),
                 float(e.rate_before), e.est_rate_before, e.est_rate_after, e.price_s, float(e.iterations_at),
                 e.ended_s, e.end, float(e.iterations_after), e.paid_back_s) for e in entries]
        if not rows:
            return
        with self._tx():
            self.conn.executemany(
                f"INSERT INTO moves({', '.join(self.MOVE_FIELDS)}) VALUES ({', '.join('?' * len(self.MOVE_FIELDS))}) "
                "ON CONFLICT(job_id, at) DO UPDATE SET ended_at = excluded.ended_at, "
                "end_reason = excluded.end_reason, iterations_after = excluded.iterations_after, "
                "paid_back_s = excluded.paid_back_s", rows)

    def moves(self, job_id: int | None = None, *, open_only: bool = False) -> list[dict]:
        """Move-ledger rows (one job's, or all; ``open_only``: those not ended), oldest
        first, as dicts of ``MOVE_FIELDS``."""
        q = f"SELECT {', '.join(self.MOVE_FIELDS)} FROM moves WHERE " + ("ended_at IS NULL" if open_only else "1")
        if job_id is None:
            rows = self.conn.execute(q + " ORDER BY at, job_id")
        else:
            rows = self.conn.execute(q + " AND job_id = ? ORDER BY at", (int(job_id),))
        return [dict(zip(self.MOVE_FIELDS, r)) | {"forced": bool(r[2])} for r in rows]

    def move_counts(self) -> dict[str, int]:
        """Counts over the move ledger (each only grows): ``decided`` and ``forced`` moves;
        of the decided ones ``giving_way`` (expected slower for the job), ``judged``
        (expected faster, with a measured rate before) and ``paid_back`` (of those, paid for
        itself so far)."""
        faster = "est_rate_before > 0 AND est_rate_after > est_rate_before"
        row = self.conn.execute(
            "SELECT COALESCE(SUM(forced = 0), 0), COALESCE(SUM(forced = 1), 0), "
            "COALESCE(SUM(forced = 0 AND est_rate_before > 0 AND est_rate_after <= est_rate_before), 0), "
            f"COALESCE(SUM(forced = 0 AND {faster} AND rate_before > 0), 0), "
            f"COALESCE(SUM(forced = 0 AND {faster} AND rate_before > 0 AND paid_back_s IS NOT NULL), 0) "
            "FROM moves").fetchone()
        return dict(zip(("decided", "forced", "giving_way", "judged", "paid_back"), map(int, row)))

    def shadow_counts(self) -> dict[str, dict[str, int]]:
        """Per shadow policy, counts over the rounds it was compared in (each only grows,
        also when old rounds are deleted): ``rounds``, ``agreeing`` (every job given the
        same grid), ``failed`` (the shadow raised), ``jobs`` compared (over the rounds it
        did not fail) and ``disagreeing`` jobs (engine/core/shadow.py)."""
        rows = self.conn.execute("SELECT policy, rounds, agreeing, failed, jobs, disagreeing FROM shadow_totals "
                                 "ORDER BY policy").fetchall()
        return {str(p): dict(zip(("rounds", "agreeing", "failed", "jobs", "disagreeing"), map(int, rest)))
                for p, *rest in rows}

    def cancel_requests(self) -> list[int]:
        """Jobs whose cancel was requested and that have not ended yet."""
        return [r[0] for r in self.conn.execute(
            "SELECT id FROM jobs WHERE cancel_requested_at IS NOT NULL AND status NOT IN "
            "('finished', 'failed', 'cancelled') ORDER BY id")]

    def _history(self, job_id: int, frm: str | None, to: str, reason: str, now: float) -> None:
        self.conn.execute("INSERT INTO job_history(job_id, from_status, to_status, reason, at) VALUES (?, ?, ?, ?, ?)",
                          (job_id, frm, to, str(reason), now))

    def _job_status(self, job_id: int) -> str:
        row = self.conn.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise InputError(f"no job {job_id!r}", field="job_id")
        return row[0]

    def _latest_launch(self, job_id: int) -> tuple[int, str] | None:
        return self.conn.execute("SELECT generation, state FROM launches WHERE job_id = ? "
                                 "ORDER BY generation DESC LIMIT 1", (job_id,)).fetchone()

    # ---- launches ---------------------------------------------------------------------

    def record_launch_intent(self, job_id: int, plan: dict, gpus: list[str] | tuple[str, ...]) -> int:
        """Before starting a launch: its plan and GPUs, state ``intent``. Returns the job's
        next generation number (1, 2, ...). Refused for a finished job, while the job has
        another active launch, or when a GPU is in another job's active launch."""
        gpus = tuple(gpus)
        if not gpus or not all(isinstance(g, str) and g for g in gpus) or len(set(gpus)) != len(gpus):
            raise InputError(f"a launch needs distinct GPU names, got {list(gpus)!r}", field="gpus")
        plan_json = _dumps(plan, "plan")
        with self._tx() as now:
            status = self._job_status(job_id)
            if status in TERMINAL:
                raise StateConflict(f"job {job_id} is {status}")
            latest = self._latest_launch(job_id)
            if latest is not None and latest[1] in ACTIVE_LAUNCH:
                raise StateConflict(f"job {job_id}: launch {latest[0]} is still {latest[1]}")
            gen = 1 if latest is None else latest[0] + 1
            self.conn.execute("INSERT INTO launches(job_id, generation, plan, state, created_at, updated_at) "
                              "VALUES (?, ?, ?, 'intent', ?, ?)", (job_id, gen, plan_json, now, now))
            try:
                self.conn.executemany("INSERT INTO launch_gpus(job_id, generation, gpu, active) VALUES (?, ?, ?, 1)",
                                      [(job_id, gen, g) for g in gpus])
            except sqlite3.IntegrityError:
                busy = self.conn.execute(
                    f"SELECT gpu, job_id FROM launch_gpus WHERE active = 1 AND gpu IN ({','.join('?' * len(gpus))})",
                    gpus).fetchall()
                raise StateConflict(f"job {job_id}: GPUs in another active launch: "
                                    f"{', '.join(f'{g} (job {j})' for g, j in busy)}") from None
        return gen

    def mark_launch(self, job_id: int, generation: int, state: str, *, pid_info: dict | None = None,
                    reason: str = "") -> None:
        """Record what happened to a launch (``LAUNCH_TRANSITIONS``); only the job's latest
        generation may. An ended launch frees its GPUs."""
        if state not in LAUNCH_STATES:
            raise InputError(f"unknown launch state {state!r}; known: {', '.join(LAUNCH_STATES)}", field="state")
        pid_json = None if pid_info is None else _dumps(pid_info, "pid_info")
        with self._tx() as now:
            cur = self._current_launch_state(job_id, generation)
            if state not in LAUNCH_TRANSITIONS[cur]:
                raise StateConflict(f"job {job_id} launch {generation}: {cur} -> {state} is not allowed")
            self.conn.execute("UPDATE launches SET state = ?, pid_info = COALESCE(?, pid_info), reason = ?, "
                              "updated_at = ? WHERE job_id = ? AND generation = ?",
                              (state, pid_json, str(reason), now, job_id, generation))
            if state not in ACTIVE_LAUNCH:
                self.conn.execute("UPDATE launch_gpus SET active = 0 WHERE job_id = ? AND generation = ?",
                                  (job_id, generation))

    def _current_launch_state(self, job_id: int, generation: int) -> str:
        """The state of ``generation`` if it is the job's latest launch, else ``StaleGeneration``."""
        latest = self._latest_launch(job_id)
        if latest is None or not isinstance(generation, int) or generation > latest[0] or generation < 1:
            self._job_status(job_id)                      # an unknown job says so
            raise InputError(f"job {job_id} has no launch {generation!r}", field="generation")
        if generation != latest[0]:
            raise StaleGeneration(f"job {job_id}: launch {generation} is not the latest ({latest[0]})")
        return latest[1]

    # ---- rounds, measurements, checkpoints --------------------------------------------

    def record_round(self, *, policy: str, trigger: str, solve_time_s: float, decisions: dict,
                     objective: float | None = None, gap: float | None = None, keep: int = 0) -> int:
        """One scheduling round's decision; returns its index (1, 2, ...). Its shadow
        comparison, if any, is added to the shadow policy's totals in the same transaction;
        ``keep`` > 0: rounds older than the last ``keep`` are deleted (0: every round kept)."""
        args = (str(policy), str(trigger), _finite(objective, "objective", optional=True),
                _finite(gap, "gap", optional=True), _finite(solve_time_s, "solve_time_s"),
                _dumps(decisions, "decisions"))
        if not (isinstance(keep, int) and not isinstance(keep, bool) and keep >= 0):
            raise InputError(f"must be an integer >= 0, got {keep!r}", field="keep_rounds")
        with self._tx() as now:
            cur = self.conn.execute("INSERT INTO rounds(at, policy, trigger, objective, gap, solve_time_s, decisions) "
                                    "VALUES (?, ?, ?, ?, ?, ?, ?)", (now, *args))
            idx = int(cur.lastrowid or 0)
            shadow = decisions.get("shadow") if isinstance(decisions, dict) else None
            if isinstance(shadow, dict) and shadow.get("policy") is not None:
                failed = shadow.get("error") is not None
                self.conn.execute(
                    "INSERT INTO shadow_totals(policy, rounds, agreeing, failed, jobs, disagreeing) "
                    "VALUES (?, 1, ?, ?, ?, ?) ON CONFLICT(policy) DO UPDATE SET rounds = rounds + 1, "
                    "agreeing = agreeing + excluded.agreeing, failed = failed + excluded.failed, "
                    "jobs = jobs + excluded.jobs, disagreeing = disagreeing + excluded.disagreeing",
                    (str(shadow["policy"]), int(bool(shadow.get("all_agree"))), int(failed),
                     0 if failed else int(shadow.get("jobs") or 0), int(shadow.get("disagreements") or 0)))
            if keep:
                self.conn.execute("DELETE FROM rounds WHERE idx <= ?", (idx - keep,))
        return idx

    def record_measurement(self, job_id: int, generation: int, *, iteration_time_s: float | None = None,
                           reconfig: dict[str, float] | None = None, step: int | None = None,
                           keep: int = 0) -> None:
        """A measured iteration time and/or reconfiguration time parts (seconds) of one
        launch. Any launch of the job may report (a measurement names its launch).
        ``keep`` > 0: of the job's iteration-time measurements, only those among its
        ``keep`` newest measurements stay (older ones are deleted in the same
        transaction); measured moves (with reconfiguration parts) are always kept."""
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
            raise InputError(f"must be an integer >= 0, got {keep!r}", field="keep_measurements")
        parts = {str(k): _finite(v, f"reconfig.{k}") for k, v in (reconfig or {}).items()}
        it = _finite(iteration_time_s, "iteration_time_s", optional=True)
        if it is None and not parts:
            raise InputError("a measurement needs an iteration time or reconfiguration parts", field="iteration_time_s")
        with self._tx() as now:
            if self.conn.execute("SELECT 1 FROM launches WHERE job_id = ? AND generation = ?",
                                 (job_id, generation)).fetchone() is None:
                raise InputError(f"job {job_id} has no launch {generation!r}", field="generation")
            self.conn.execute("INSERT INTO measurements(job_id, generation, at, step, iteration_time_s, reconfig) "
                              "VALUES (?, ?, ?, ?, ?, ?)",
                              (job_id, generation, now, step, it, _dumps(parts, "reconfig")))
            if keep and not parts:
                self.conn.execute(            # the cut-off from the (job_id, id) index alone
                    "DELETE FROM measurements WHERE job_id = ? AND reconfig = '{}' AND id <= "
                    "(SELECT id FROM measurements WHERE job_id = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
                    (job_id, job_id, keep))

    def record_checkpoint(self, job_id: int, generation: int, step: int, path: str) -> None:
        """A completed checkpoint of the job's latest launch (an older launch's late report
        is refused: the job may have moved on from it). Reporting the same one again is a
        no-op; the same step at another path is refused."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InputError(f"must be an integer >= 0, got {step!r}", field="step")
        with self._tx() as now:
            self._current_launch_state(job_id, generation)
            have = self.conn.execute("SELECT path FROM checkpoints WHERE job_id = ? AND generation = ? AND step = ?",
                                     (job_id, generation, step)).fetchone()
            if have is not None:                 # a repeated report: the same is a no-op
                if have[0] != str(path):
                    raise StateConflict(f"job {job_id} launch {generation}: step {step} already saved at {have[0]}")
                return
            self.conn.execute("INSERT INTO checkpoints(job_id, generation, step, path, at) VALUES (?, ?, ?, ?, ?)",
                              (job_id, generation, step, str(path), now))

    # ---- reads ------------------------------------------------------------------------

    def status_counts(self) -> dict[str, int]:
        """How many jobs are in each status (every status listed, zeros included)."""
        out = dict.fromkeys(JOB_STATUSES, 0)
        out.update(self.conn.execute("SELECT status, COUNT(*) FROM jobs GROUP BY status").fetchall())
        return out

    _JOB_COLUMNS = "id, name, spec, status, submitted_at, updated_at, priority, submitted_by"

    @staticmethod
    def _job_row(i, n, s, st, sub, up, prio, by) -> JobRow:
        """A job's row; its spec carries the priority set since submission, if any."""
        spec = json.loads(s)
        if prio is not None:
            spec["priority"] = prio
        return JobRow(i, n, spec, st, sub, up, by)

    def jobs(self, status: str | None = None, ids: Iterable[int] | None = None,
             last: int | None = None) -> list[JobRow]:
        """Jobs by id, all or those in ``status`` (and, given ``ids``, only those; given
        ``last``, only the ``last`` newest of them, still by id)."""
        q = f"SELECT {self._JOB_COLUMNS} FROM jobs WHERE (? IS NULL OR status = ?)"
        if last is not None:
            if ids is not None or isinstance(last, bool) or not isinstance(last, int) or last < 0:
                raise InputError(f"must be an integer >= 0 (and no ids), got {last!r}", field="last")
            rows = self.conn.execute(f"SELECT * FROM ({q} ORDER BY id DESC LIMIT ?) ORDER BY id",
                                     (status, status, last)).fetchall()
        elif ids is None:
            rows = self.conn.execute(q + " ORDER BY id", (status, status)).fetchall()
        else:
            rows = []
            for part, marks in _id_chunks(ids):
                rows += self.conn.execute(q + f" AND id IN ({marks}) ORDER BY id", (status, status, *part)).fetchall()
        return [self._job_row(*r) for r in rows]

    def page_jobs(self, ended: int) -> tuple[list[JobRow], int]:
        """Every job that has not ended and the ``ended`` that ended last (by the time of
        their last change), by id; and how many have ended in all. Only those rows are read."""
        done = "(" + ", ".join(f"'{st}'" for st in sorted(TERMINAL)) + ")"
        q = (f"SELECT {self._JOB_COLUMNS} FROM jobs WHERE status NOT IN {done} UNION ALL SELECT * FROM "
             f"(SELECT {self._JOB_COLUMNS} FROM jobs WHERE status IN {done} ORDER BY updated_at DESC, id DESC "
             "LIMIT ?) ORDER BY id")
        rows = [self._job_row(*r) for r in self.conn.execute(q, (max(0, int(ended)),))]
        total = self.conn.execute(f"SELECT COUNT(*) FROM jobs WHERE status IN {done}")
        return rows, int(total.fetchone()[0])

    def job_ids(self, status: str) -> list[int]:
        """Ids of the jobs in ``status`` (nothing parsed: cheap to poll)."""
        return [int(r[0]) for r in self.conn.execute("SELECT id FROM jobs WHERE status = ? ORDER BY id", (status,))]

    def data_version(self) -> int:
        """SQLite's ``PRAGMA data_version``: another value after another connection (the
        API's, a command's) committed; this connection's own commits leave it."""
        return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

    def last_generations(self) -> dict[int, int]:
        """Per job in the store, its latest launch generation (0: never launched)."""
        return {int(j): int(g) for j, g in self.conn.execute(
            "SELECT j.id, COALESCE(MAX(l.generation), 0) FROM jobs j LEFT JOIN launches l ON l.job_id = j.id "
            "GROUP BY j.id")}

    def job(self, job_id: int) -> JobRow:
        row = self.conn.execute(f"SELECT {self._JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise InputError(f"no job {job_id!r}", field="job_id")
        return self._job_row(*row)

    def history(self, job_id: int) -> list[HistoryRow]:
        return [HistoryRow(*r) for r in self.conn.execute(
            "SELECT job_id, from_status, to_status, reason, at FROM job_history WHERE job_id = ? ORDER BY id",
            (job_id,))]

    def launches(self, job_id: int | None = None, *, active_only: bool = False) -> list[LaunchRow]:
        where, args = [], []
        if job_id is not None:
            where.append("l.job_id = ?")
            args.append(job_id)
        if active_only:
            where.append("l.state IN ('intent', 'started')")
        q = ("SELECT l.job_id, l.generation, l.plan, l.state, l.pid_info, l.reason, l.created_at, l.updated_at, "
             "(SELECT json_group_array(gpu) FROM (SELECT gpu FROM launch_gpus g WHERE g.job_id = l.job_id AND "
             "g.generation = l.generation ORDER BY rowid)) FROM launches l"
             + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY l.job_id, l.generation")
        return [LaunchRow(j, g, json.loads(p), tuple(json.loads(gp)), st, None if pi is None else json.loads(pi),
                          r, c, u) for j, g, p, st, pi, r, c, u, gp in self.conn.execute(q, args)]

    def running_launches(self) -> list[LaunchRow]:
        """Launches in state ``intent`` or ``started``: what a restarted service must look
        at (re-adopt if its processes live, else mark failed and relaunch)."""
        return self.launches(active_only=True)

    def rounds(self, last: int | None = None) -> list[RoundRow]:
        q = "SELECT idx, at, policy, trigger, objective, gap, solve_time_s, decisions FROM rounds ORDER BY idx DESC"
        rows = self.conn.execute(q + (" LIMIT ?" if last else ""), (last,) if last else ()).fetchall()
        return [RoundRow(i, at, pol, trig, obj, gap, t, json.loads(dec))
                for i, at, pol, trig, obj, gap, t, dec in reversed(rows)]

    def measurements(self, job_id: int) -> list[MeasurementRow]:
        return [MeasurementRow(j, g, a, s, it, json.loads(rc)) for j, g, a, s, it, rc in self.conn.execute(
            "SELECT job_id, generation, at, step, iteration_time_s, reconfig FROM measurements WHERE job_id = ? "
            "ORDER BY id", (job_id,))]

    def checkpoints(self, job_id: int) -> list[CheckpointRow]:
        return [CheckpointRow(*r) for r in self.conn.execute(
            "SELECT job_id, generation, step, path, at FROM checkpoints WHERE job_id = ? ORDER BY step, id",
            (job_id,))]

    def latest_checkpoint(self, job_id: int) -> CheckpointRow | None:
        cps = self.checkpoints(job_id)
        return cps[-1] if cps else None

    def check(self) -> list[str]:
        """Inconsistencies (empty: none): SQLite's integrity check, and this schema's rules:
        each job's history is a chain of allowed transitions ending at its status (and of
        notes from a status to itself, e.g. a priority change); launch
        generations are 1..n with at most one active, none for an ended job; a GPU is
        active in one launch at most, exactly in the active launches; a job has at most one
        open move, and no move ends before it began."""
        out = [r[0] for r in self.conn.execute("PRAGMA integrity_check") if r[0] != "ok"]
        out += [f"foreign key: {r}" for r in self.conn.execute("PRAGMA foreign_key_check")]
        for job in self.jobs():
            hist = self.history(job.id)
            prev = None
            for h in hist:
                ok = (h.from_status is None and prev is None and h.to_status == "queued") or (
                    prev is not None and h.from_status == prev and (h.to_status in TRANSITIONS[prev]
                                                                    or h.to_status == prev))   # a note
                if not ok:
                    out.append(f"job {job.id}: history step {h.from_status} -> {h.to_status} after {prev}")
                prev = h.to_status
            if prev != job.status:
                out.append(f"job {job.id}: status {job.status} but history ends at {prev}")
            launches = self.launches(job.id)
            if [l.generation for l in launches] != list(range(1, len(launches) + 1)):
                out.append(f"job {job.id}: generations {[l.generation for l in launches]}")
            active = [l for l in launches if l.state in ACTIVE_LAUNCH]
            if len(active) > 1 or (active and active[0] is not launches[-1]):
                out.append(f"job {job.id}: active launches {[l.generation for l in active]}")
            if active and job.status in TERMINAL:
                out.append(f"job {job.id}: {job.status} with launch {active[0].generation} {active[0].state}")
            if job.status == "running" and not launches:
                out.append(f"job {job.id}: running without a launch")
        bad_gpus = self.conn.execute(
            "SELECT g.job_id, g.generation, g.gpu, g.active, l.state FROM launch_gpus g JOIN launches l "
            "USING (job_id, generation) WHERE (g.active = 1) != (l.state IN ('intent', 'started'))").fetchall()
        out += [f"job {j} launch {g}: gpu {gpu} active={a} in state {s}" for j, g, gpu, a, s in bad_gpus]
        for j, n in self.conn.execute("SELECT job_id, COUNT(*) FROM moves WHERE ended_at IS NULL GROUP BY job_id "
                                      "HAVING COUNT(*) > 1"):
            out.append(f"job {j}: {n} moves open at once (a move ends where the next begins)")
        out += [f"job {j}: move at {at} ends before it began ({end})" for j, at, end in self.conn.execute(
            "SELECT job_id, at, ended_at FROM moves WHERE ended_at IS NOT NULL AND ended_at < at")]
        return out
