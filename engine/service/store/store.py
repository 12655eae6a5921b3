"""The service's state in SQLite: ``Store``, one connection, and its table groups
(``Store.jobs``, ``.launches``, ``.nodes``, ``.rounds``, ``.moves``); see the package's
doc (engine/service/store/__init__.py) for the rules that make it crash-safe."""
from __future__ import annotations

import os
import sqlite3
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from instances.errors import InputError

from .jobs import JobTable
from .launches import LaunchTable
from .moves import MoveTable
from .nodes import NodeTable
from .rounds import RoundTable
from .rules import ACTIVE_LAUNCH, TERMINAL, TRANSITIONS, StateConflict
from .schema import RESTORE, SCHEMA_VERSION, migrate, missing_schema

BUSY_TIMEOUT_MS = 10_000


def check_state_file(path: Path, field: str | None = None) -> None:
    """A state database's path holds a regular file or nothing yet; else an
    ``InputError`` naming it (SQLite would block on a pipe, or fail on a device, with
    its own words)."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as e:                        # a name too long, a link loop ...
        raise InputError(f"cannot be used as the state database: {e.strerror or e}", file=str(path),
                         field=field) from None
    if stat.S_ISDIR(mode):
        raise InputError("is a folder, not a database file", file=str(path), field=field)
    if not stat.S_ISREG(mode):
        raise InputError("not a regular file (a pipe, a device or a socket): not a state database", file=str(path),
                         field=field)


class Store:
    """One connection to the state database (``readonly``: a reader in another process),
    and its table groups: ``jobs`` (jobs and their status history), ``launches`` (launches,
    their GPUs, measurements and checkpoints), ``nodes`` (drained nodes, failed runs per
    node), ``rounds`` (decisions and shadow totals), ``moves`` (the move ledger)."""

    def __init__(self, path: str | Path, *, readonly: bool = False, clock: Callable[[], float] = time.time):
        self.path, self.readonly, self.clock = Path(path), readonly, clock
        check_state_file(self.path)
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
            missing = missing_schema(self.conn)
            if missing:
                raise InputError(f"the state database is damaged: it has no {', no '.join(missing[:3])}"
                                 + (f" (and {len(missing) - 3} more)" if len(missing) > 3 else "")
                                 + f", which its schema version {SCHEMA_VERSION} has; {RESTORE}",
                                 file=str(self.path), field=missing[0].split(" ", 1)[1].strip("'"))
        except sqlite3.DatabaseError as e:
            self.conn.close()
            raise InputError(f"not a usable SQLite database: {e}", file=str(self.path)) from None
        except BaseException:
            self.conn.close()
            raise
        self.jobs = JobTable(self.conn, self._tx)
        self.launches = LaunchTable(self.conn, self._tx)
        self.nodes = NodeTable(self.conn, self._tx)
        self.rounds = RoundTable(self.conn, self._tx)
        self.moves = MoveTable(self.conn, self._tx)

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

    def data_version(self) -> int:
        """SQLite's ``PRAGMA data_version``: another value after another connection (the
        API's, a command's) committed; this connection's own commits leave it."""
        return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

    def refuse_damaged(self, field: str | None = None) -> None:
        """An ``InputError`` naming this file, what ``check()`` finds wrong and how to
        restore, when it finds anything (a service refuses to start on such a state; the
        check reads many rows, so only where no one else writes)."""
        self._refuse(self.check(), field)

    def refuse_unreadable(self, field: str | None = None) -> None:
        """The same for the jobs whose specification cannot be read (``JobTable.unreadable``,
        one row at a time: true while a service writes too)."""
        self._refuse(self._unreadable(), field)

    def _unreadable(self) -> list[str]:
        return [f"job {j}: its {col} cannot be read ({why})" for j, col, why in self.jobs.unreadable()]

    def _refuse(self, problems: list[str], field: str | None) -> None:
        if problems:
            raise InputError(f"the state database is damaged: {'; '.join(problems[:3])}"
                             + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "") + f"; {RESTORE}",
                             file=str(self.path), field=field)

    def check(self) -> list[str]:
        """Inconsistencies (empty: none): SQLite's integrity check, every job's stored
        specification readable (``JobTable.unreadable``), and this schema's rules:
        each job's history is a chain of allowed transitions ending at its status (and of
        notes from a status to itself, e.g. a priority change); launch
        generations are 1..n with at most one active, none for an ended job; a GPU is
        active in one launch at most, exactly in the active launches; a job has at most one
        open move, and no move ends before it began."""
        out = [r[0] for r in self.conn.execute("PRAGMA integrity_check") if r[0] != "ok"]
        out += [f"foreign key: {r}" for r in self.conn.execute("PRAGMA foreign_key_check")]
        unreadable = self._unreadable()
        if unreadable:              # (the rules below read every job's row)
            return out + unreadable
        for job in self.jobs.rows():
            hist = self.jobs.history(job.id)
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
            launches = self.launches.rows(job.id)
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
