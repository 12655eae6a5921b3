"""Makespan-oriented weights: favour the jobs whose remaining work will end the run.

Coefficient of x[j, g] = speedup(j, g) * (T_j / T_max) ** exponent, where T_j is job j's
remaining time and T_max the largest over the round's jobs. ``basis`` says at which
throughput T_j is counted: ``fastest`` (default: its fastest column this round, so T_j
is the earliest it could finish on the grid it runs fastest on, a lower bound on its
finish; T_max is then a lower bound on the makespan, and the job that sets it is the one
whose work scales worst, not only the one with most work) or ``reference`` (the job's
reference throughput, as the ``jct`` term counts it; measured worse, docs/engine.md).
The counterweight of the ``jct`` term, which ranks these same jobs last: with both, the
round still favours short jobs, but the longest job — the one that sets the makespan when
the queue is deep — keeps a share of the value for running fast.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import register_term

BASES = ("reference", "fastest")


@register_term("makespan")
@dataclass(frozen=True)
class LongestRemainingWork:
    exponent: float = 2.0
    basis: str = "fastest"

    def __post_init__(self):
        if not self.exponent >= 0:
            raise ValueError("makespan.exponent must be >= 0")
        if self.basis not in BASES:
            raise ValueError(f"makespan.basis must be one of {', '.join(BASES)}, got {self.basis!r}")

    @property
    def columnwise(self) -> bool:
        return self.basis != "fastest"          # the fastest basis reads every column of a job

    def apply(self, data, builder, weight: float) -> None:
        if data.n_jobs == 0:
            return
        speedup = data.speedup
        t = data.remaining_time_ref_s
        if self.basis == "fastest":
            best = np.zeros(data.n_jobs)
            np.maximum.at(best, data.col_job, speedup)
            t = t / np.where(best > 0, best, 1.0)       # a job with no column keeps its reference
        t = np.maximum(t, 1e-9)
        factor = (t / t.max()) ** self.exponent
        builder.add_x_objective(weight * speedup * factor[data.col_job])
