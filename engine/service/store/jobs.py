"""Jobs and their status history (tables ``jobs``, ``job_history``): one table group of
the service's store, over the store's connection and its transactions."""
from __future__ import annotations

import json
from typing import Iterable

from instances.errors import InputError
from instances.limits import check_priority

from ..auth import USER_RE
from ..jobspec import JobSpec
from .rows import HistoryRow, JobRow
from .rules import (
    ACTIVE_LAUNCH,
    JOB_STATUSES,
    MAX_KEY_CHARS,
    TERMINAL,
    TRANSITIONS,
    StateConflict,
)
from .table import Table, dumps_json, id_chunks


class JobTable(Table):
    """Jobs and their status history; ``Store.jobs``."""

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
        body = dumps_json(spec.to_dict(), "spec")
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
        another status needs the job's launch ended first (``LaunchTable.mark``); entering
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

    def cancel_requests(self) -> list[int]:
        """Jobs whose cancel was requested and that have not ended yet."""
        return [r[0] for r in self.conn.execute(
            "SELECT id FROM jobs WHERE cancel_requested_at IS NOT NULL AND status NOT IN "
            "('finished', 'failed', 'cancelled') ORDER BY id")]

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

    def priorities_set(self) -> dict[int, float]:
        """Priorities set since submission, of the jobs that have not ended (id -> priority)."""
        return {int(i): float(p) for i, p in self.conn.execute(
            "SELECT id, priority FROM jobs WHERE priority IS NOT NULL AND status IN ('queued', 'running', 'held')")}

    def statuses(self, job_ids) -> dict[int, str]:
        """The status of each of ``job_ids`` that exists."""
        out: dict[int, str] = {}
        for part, marks in id_chunks(job_ids):
            out.update((int(i), str(st)) for i, st in self.conn.execute(
                f"SELECT id, status FROM jobs WHERE id IN ({marks})", part))
        return out

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

    def rows(self, status: str | None = None, ids: Iterable[int] | None = None,
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
            for part, marks in id_chunks(ids):
                rows += self.conn.execute(q + f" AND id IN ({marks}) ORDER BY id", (status, status, *part)).fetchall()
        return [self._job_row(*r) for r in rows]

    def page(self, ended: int) -> tuple[list[JobRow], int]:
        """Every job that has not ended and the ``ended`` that ended last (by the time of
        their last change), by id; and how many have ended in all. Only those rows are read."""
        done = "(" + ", ".join(f"'{st}'" for st in sorted(TERMINAL)) + ")"
        q = (f"SELECT {self._JOB_COLUMNS} FROM jobs WHERE status NOT IN {done} UNION ALL SELECT * FROM "
             f"(SELECT {self._JOB_COLUMNS} FROM jobs WHERE status IN {done} ORDER BY updated_at DESC, id DESC "
             "LIMIT ?) ORDER BY id")
        rows = [self._job_row(*r) for r in self.conn.execute(q, (max(0, int(ended)),))]
        total = self.conn.execute(f"SELECT COUNT(*) FROM jobs WHERE status IN {done}")
        return rows, int(total.fetchone()[0])

    def unreadable(self) -> list[tuple[int, str, str]]:
        """Jobs whose stored specification cannot be read back (a database damaged by hand
        or by a disk): (id, column, why): a spec that is not JSON, or not a job
        (``JobSpec.from_dict``, files not checked), a priority that is not a number."""
        out = []
        for jid, spec, prio in self.conn.execute("SELECT id, spec, priority FROM jobs ORDER BY id"):
            try:
                d = json.loads(spec)
            except (TypeError, ValueError) as e:
                out.append((int(jid), "spec", f"not JSON: {e}"))
                continue
            try:
                JobSpec.from_dict(d, source=f"job {jid}", check_files=False)
                if prio is not None:
                    check_priority(prio)
            except InputError as e:
                out.append((int(jid), "priority" if e.field == "priority" and prio is not None else "spec",
                            f"field {e.field!r}: {e.reason}" if e.field else e.reason))
        return out

    def ids(self, status: str) -> list[int]:
        """Ids of the jobs in ``status`` (nothing parsed: cheap to poll)."""
        return [int(r[0]) for r in self.conn.execute("SELECT id FROM jobs WHERE status = ? ORDER BY id", (status,))]

    def get(self, job_id: int) -> JobRow:
        row = self.conn.execute(f"SELECT {self._JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise InputError(f"no job {job_id!r}", field="job_id")
        return self._job_row(*row)

    def history(self, job_id: int) -> list[HistoryRow]:
        return [HistoryRow(*r) for r in self.conn.execute(
            "SELECT job_id, from_status, to_status, reason, at FROM job_history WHERE job_id = ? ORDER BY id",
            (job_id,))]
