"""The move ledger (table ``moves``): one table group of the service's store, over the
store's connection and its transactions."""
from __future__ import annotations

from typing import Any, Iterable

from .table import Table


class MoveTable(Table):
    """The move ledger; ``Store.moves``."""

    FIELDS = ("job_id", "at", "forced", "from_grid", "to_grid", "rate_before", "est_rate_before",
                   "est_rate_after", "price_s", "iterations_at", "ended_at", "end_reason", "iterations_after",
                   "paid_back_s")

    def record(self, entries: Iterable[Any]) -> None:
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
                f"INSERT INTO moves({', '.join(self.FIELDS)}) VALUES ({', '.join('?' * len(self.FIELDS))}) "
                "ON CONFLICT(job_id, at) DO UPDATE SET ended_at = excluded.ended_at, "
                "end_reason = excluded.end_reason, iterations_after = excluded.iterations_after, "
                "paid_back_s = excluded.paid_back_s", rows)

    def rows(self, job_id: int | None = None, *, open_only: bool = False) -> list[dict]:
        """Move-ledger rows (one job's, or all; ``open_only``: those not ended), oldest
        first, as dicts of ``FIELDS``."""
        q = f"SELECT {', '.join(self.FIELDS)} FROM moves WHERE " + ("ended_at IS NULL" if open_only else "1")
        if job_id is None:
            rows = self.conn.execute(q + " ORDER BY at, job_id")
        else:
            rows = self.conn.execute(q + " AND job_id = ? ORDER BY at", (int(job_id),))
        return [dict(zip(self.FIELDS, r)) | {"forced": bool(r[2])} for r in rows]

    def counts(self) -> dict[str, int]:
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
