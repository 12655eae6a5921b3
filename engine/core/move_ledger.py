"""The move ledger: for every move of a running job, what the decision expected and what
the move then gave, so that "moves that are not worth it" is a measured share, not a
count of reconfigurations.

An entry opens when a running job is moved (a decided move, or a forced one off a node
that left service) and closes at the job's next change (moved again, preempted, evicted,
failed), when it finishes, or when the run ends. It records:

- the job's measured rate before the move (iterations/s, the stability rule's
  ``rate_before_change``; 0 when it had not been measured yet: then the entry cannot be
  judged) and the decision's own view: the round loop's performance model's estimate of
  the old and the new grid (``est_gain`` = new rate / old rate; the model the policy
  decided with — for the data-parallel-only baselines the full model, not their twin —
  never the truth) and the downtime the move was priced at (``ReconfigCostModel``);
- what followed: the iterations made from the move until the entry closed (real
  downtime included), the realized rate over that time and its ratio to the rate before
  (``realized_gain``), and **payback**: the move has paid for itself once the progress
  since it is at least what staying would have made at the old rate, ``iterations >=
  rate_before x elapsed`` (the stability rule's test). ``paid_back_s`` is the time from
  the move to the first round where that held (round granularity), empty if it never
  did before the entry closed.

A move the model expected to be *slower* for the job (``est_gain <= 1``: it gave up GPUs
to make room for others) cannot pay for itself by this test; the summary counts those
apart (``moves_giving_way``) and judges payback on the moves expected to speed the job
up. Measured progress, not the truth oracle: the same figures live and simulated.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, fields


@dataclass
class MoveEntry:
    job_id: str
    time_s: float
    forced: bool                    # off a node that left service, not a decision
    from_grid: str
    to_grid: str
    rate_before: float              # iterations/s measured before the move (0: not measured)
    est_rate_before: float | None   # the performance model's, on the old grid
    est_rate_after: float | None    # ... on the new grid
    price_s: float | None           # the downtime the move was priced at
    iterations_at: float            # the job's progress at the move
    ended_s: float | None = None
    end: str = ""                   # moved again | preempted | evicted | failed | cancelled | held |
                                    # finished | run ended (live: service restarted)
    iterations_after: float = 0.0   # made from the move until the entry closed (while open: until
                                    # the last reading)
    paid_back_s: float | None = None

    @property
    def est_gain(self) -> float | None:
        if not self.est_rate_before or self.est_rate_after is None:
            return None
        return self.est_rate_after / self.est_rate_before

    @property
    def elapsed_s(self) -> float | None:
        return None if self.ended_s is None else self.ended_s - self.time_s

    @property
    def realized_gain(self) -> float | None:
        el = self.elapsed_s
        if not self.rate_before or not el or el <= 0:
            return None
        return self.iterations_after / el / self.rate_before

    @property
    def paid_back(self) -> bool | None:
        """Whether it paid for itself before the entry closed (None: not judged, no rate before)."""
        if not self.rate_before:
            return None
        return self.paid_back_s is not None

    def row(self) -> dict:
        d = asdict(self)
        d.update(est_gain=self.est_gain, elapsed_s=self.elapsed_s, realized_gain=self.realized_gain,
                 paid_back=self.paid_back)
        return d


COLUMNS = tuple(f.name for f in fields(MoveEntry)) + ("est_gain", "elapsed_s", "realized_gain", "paid_back")


class MoveLedger:
    """Open entries by job, and every entry in the order the moves happened."""

    def __init__(self):
        self.entries: list[MoveEntry] = []
        self._open: dict[str, MoveEntry] = {}

    def opened(self, entry: MoveEntry) -> None:
        self.closed(entry.job_id, entry.time_s, entry.iterations_at, "moved again")
        self.entries.append(entry)
        self._open[entry.job_id] = entry

    @staticmethod
    def _reading(e: MoveEntry, now_s: float, iterations_done: float) -> None:
        """Mark ``e`` paid back at ``now_s`` if the progress since the move is at least what
        staying would have made (and it is not marked yet)."""
        made = iterations_done - e.iterations_at
        if e.paid_back_s is None and e.rate_before and made > 0 and made >= e.rate_before * (now_s - e.time_s):
            e.paid_back_s = now_s - e.time_s

    def observe(self, job_id: str, now_s: float, iterations_done: float) -> None:
        """A round's progress reading of a running job."""
        e = self._open.get(job_id)
        if e is not None:
            self._reading(e, now_s, iterations_done)
            e.iterations_after = max(0.0, iterations_done - e.iterations_at)

    def reopen(self, entry: MoveEntry) -> None:
        """An entry that an earlier run of the live service left open, its job then running
        where the move put it (engine/service/daemon.py, recovery): it stays open in this
        run and closes at the job's next change, so that what the job makes after the
        restart counts too. Not in ``entries`` (the moves of this run)."""
        self._open[entry.job_id] = entry

    def launched(self, job_id: str, now_s: float, grid: str, iterations_done: float) -> None:
        """A queued job is launched on ``grid``. Only a reopened entry can be open then:
        it stays open when the job runs where its move put it again, and closes (``service
        restarted``) when it does not."""
        e = self._open.get(job_id)
        if e is not None and e.to_grid != grid:
            self.closed(job_id, now_s, iterations_done, "service restarted")

    def closed(self, job_id: str, now_s: float, iterations_done: float, end: str) -> None:
        """Close the job's open entry (if any) at ``iterations_done``; the closing reading
        counts as a round's (a job that finished between two rounds paid back then)."""
        e = self._open.pop(job_id, None)
        if e is None:
            return
        self._reading(e, now_s, iterations_done)
        e.iterations_after = max(0.0, iterations_done - e.iterations_at)
        e.ended_s, e.end = now_s, end

    def close_all(self, now_s: float, progress: dict[str, float]) -> None:
        """The run ended: close what is still open at ``progress`` (iterations by job)."""
        for jid in list(self._open):
            self.closed(jid, now_s, progress.get(jid, self._open[jid].iterations_at), "run ended")

    def summary(self) -> dict:
        """Counts and medians over the decided moves (forced ones counted apart)."""
        decided = [e for e in self.entries if not e.forced]
        speeding = [e for e in decided if e.est_gain is not None and e.est_gain > 1.0]
        judged = [e for e in speeding if e.paid_back is not None]
        paid = [e for e in judged if e.paid_back]

        def median(xs):
            xs = [x for x in xs if x is not None and math.isfinite(x)]
            return statistics.median(xs) if xs else None
        return {
            "moves_decided": len(decided),
            "moves_forced": len(self.entries) - len(decided),
            "moves_giving_way": sum(1 for e in decided if e.est_gain is not None and e.est_gain <= 1.0),
            "moves_speeding_up": len(speeding),
            "moves_paid_back_share": len(paid) / len(judged) if judged else None,
            "moves_paid_back_median_s": median(e.paid_back_s for e in paid),
            "moves_est_gain_median": median(e.est_gain for e in speeding),
            "moves_realized_gain_median": median(e.realized_gain for e in speeding),
        }
