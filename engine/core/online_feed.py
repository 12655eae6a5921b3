"""Running jobs' measured iteration times to a performance model that learns online.

Each round the round loop hands every running job's ``JobProgress`` to ``OnlineFeed``.
Executors report ``measured_iteration_time_s`` as the mean over the
``measured_iterations`` iterations the job has run on its current allocation since it
was launched or moved there; the feed turns these running means into the new
iterations since the last round (and their mean) and calls the model's ``observe``. A
job seen on another allocation, or with fewer measured iterations than last time, has
started a new run: its measurements count from zero. With a performance model that does
not learn online (``estimators.LearnsOnline``) the feed does nothing.
"""
from __future__ import annotations

import math
from typing import Iterable

from estimators.base import LearnsOnline
from instances.jobs import Job

from .allocation import Allocation
from .executor import JobProgress


class OnlineFeed:
    def __init__(self, perf: object):
        self.model: LearnsOnline | None = perf if isinstance(perf, LearnsOnline) else None
        self._last: dict[str, tuple[Allocation, float, float]] = {}    # job -> (alloc, iterations, mean s)

    def report(self, job: Job, alloc: Allocation | None, p: JobProgress) -> None:
        """One running job's progress, read this round while it runs on ``alloc``."""
        if self.model is None or alloc is None:
            return
        n, mean = float(p.measured_iterations or 0.0), p.measured_iteration_time_s
        if not (0 < n < math.inf and mean is not None and 0 < mean < math.inf):
            return                        # nothing measured yet (or a report that is no measurement)
        last = self._last.get(p.job_id)
        n0, s0 = 0.0, 0.0
        if last is not None and last[0] == alloc and last[1] <= n:
            n0, s0 = last[1], last[1] * last[2]
        self._last[p.job_id] = (alloc, n, mean)
        dn, ds = n - n0, n * mean - s0
        if dn > 0 and ds > 0:
            self.model.observe(job, alloc.grid, ds / dn, dn)

    def keep_only(self, running: Iterable[str]) -> None:
        """Forget the runs of jobs that no longer run (their next run starts from zero)."""
        keep = set(running)
        for jid in [j for j in self._last if j not in keep]:
            del self._last[jid]
