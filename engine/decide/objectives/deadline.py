"""Deadlines, as a bonus (``mode="penalty"``) or a hard constraint (``mode="constraint"``).

A column *meets* job j's deadline when its estimated rate finishes the remaining
iterations by the deadline. Penalty mode: +1 on every column that meets it (so a job
that misses pays the weight). Constraint mode: a row "some meeting column is chosen"
for every job with a deadline that some column can still meet (may make the round
infeasible; the solver layer then falls back to a greedy decision and says so).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import register_term

MODES = ("penalty", "constraint")


@register_term("deadline")
@dataclass(frozen=True)
class Deadline:
    mode: str = "penalty"

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"deadline.mode must be one of {MODES}, got {self.mode!r}")

    @property
    def columnwise(self) -> bool:
        return self.mode == "penalty"           # a constraint row exists only if some column meets it

    def meets(self, data) -> np.ndarray:
        left_s = data.deadline_s[data.col_job] - data.now_s
        need_s = data.remaining_iterations[data.col_job] / np.maximum(data.col_rate_iters_per_s(), 1e-300)
        return np.isfinite(left_s) & (left_s > 0) & (need_s <= left_s)

    def apply(self, data, builder, weight: float) -> None:
        ok = self.meets(data)
        if self.mode == "penalty":
            builder.add_x_objective(weight * ok.astype(float))
            return
        jobs = np.unique(data.col_job[ok])
        if len(jobs) == 0:
            return
        local = {int(j): i for i, j in enumerate(jobs)}
        cols = np.flatnonzero(ok)
        rows = np.array([local[int(j)] for j in data.col_job[cols]], dtype=np.int64)
        builder.add_rows(rows, cols, np.ones(len(cols)), 1.0, np.inf,
                         [f"deadline_{data.job_ids[j]}" for j in jobs])
