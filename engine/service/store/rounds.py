"""Scheduling rounds and the shadow policy's totals (tables ``rounds``, ``shadow_totals``):
one table group of the service's store, over the store's connection and its transactions."""
from __future__ import annotations

import json

from instances.errors import InputError

from .rows import RoundRow
from .table import Table, dumps_json, finite


class RoundTable(Table):
    """Rounds and shadow totals; ``Store.rounds``."""

    def record(self, *, policy: str, trigger: str, solve_time_s: float, decisions: dict,
                     objective: float | None = None, gap: float | None = None, keep: int = 0) -> int:
        """One scheduling round's decision; returns its index (1, 2, ...). Its shadow
        comparison, if any, is added to the shadow policy's totals in the same transaction;
        ``keep`` > 0: rounds older than the last ``keep`` are deleted (0: every round kept)."""
        args = (str(policy), str(trigger), finite(objective, "objective", optional=True),
                finite(gap, "gap", optional=True), finite(solve_time_s, "solve_time_s"),
                dumps_json(decisions, "decisions"))
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

    def rows(self, last: int | None = None) -> list[RoundRow]:
        q = "SELECT idx, at, policy, trigger, objective, gap, solve_time_s, decisions FROM rounds ORDER BY idx DESC"
        rows = self.conn.execute(q + (" LIMIT ?" if last else ""), (last,) if last else ()).fetchall()
        return [RoundRow(i, at, pol, trig, obj, gap, t, json.loads(dec))
                for i, at, pol, trig, obj, gap, t, dec in reversed(rows)]

    def shadow_counts(self) -> dict[str, dict[str, int]]:
        """Per shadow policy, counts over the rounds it was compared in (each only grows,
        also when old rounds are deleted): ``rounds``, ``agreeing`` (every job given the
        same grid), ``failed`` (the shadow raised), ``jobs`` compared (over the rounds it
        did not fail) and ``disagreeing`` jobs (engine/core/shadow.py)."""
        rows = self.conn.execute("SELECT policy, rounds, agreeing, failed, jobs, disagreeing FROM shadow_totals "
                                 "ORDER BY policy").fetchall()
        return {str(p): dict(zip(("rounds", "agreeing", "failed", "jobs", "disagreeing"), map(int, rest)))
                for p, *rest in rows}
