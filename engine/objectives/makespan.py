"""Makespan-oriented weights: favour the jobs whose remaining work will end the run.

Coefficient of x[j, g] = speedup(j, g) * (T_j / T_max) ** exponent, where T_j is job j's
remaining time at its reference throughput and T_max the largest over the round's jobs.
The counterweight of the ``jct`` term, which ranks these same jobs last: with both, the
round still favours short jobs, but the longest job — the one that sets the makespan when
the queue is deep — keeps a share of the value for running fast.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import register_term


@register_term("makespan")
@dataclass(frozen=True)
class LongestRemainingWork:
    exponent: float = 2.0

    def __post_init__(self):
        if not self.exponent >= 0:
            raise ValueError("makespan.exponent must be >= 0")

    def apply(self, data, builder, weight: float) -> None:
        if data.n_jobs == 0:
            return
        t = np.maximum(data.remaining_time_ref_s, 1e-9)
        factor = (t / t.max()) ** self.exponent
        builder.add_x_objective(weight * data.speedup * factor[data.col_job])
