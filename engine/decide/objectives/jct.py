"""JCT-oriented weights: favour jobs with little remaining work (SRPT-like).

Coefficient of x[j, g] = speedup(j, g) * (T_med / T_j) ** exponent, where T_j is job j's
remaining time at its reference throughput and T_med the median over the round's jobs;
the factor is clipped to [1/max_factor, max_factor] so that one nearly finished job
cannot dominate the round.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import register_term


def median(t: np.ndarray) -> float:
    """``np.median`` of a non-empty 1-D array, to the bit (the mean of the two middle
    values is their sum halved, as ``np.mean`` computes it; nan when any value is nan),
    without its overhead: every round of a replay asks for one."""
    s = np.sort(t)
    if np.isnan(s[-1]):                 # nan sorts last
        return math.nan
    h = len(s) // 2
    return float(s[h]) if len(s) % 2 else (float(s[h - 1]) + float(s[h])) / 2


@register_term("jct")
@dataclass(frozen=True)
class ShortRemainingWork:
    exponent: float = 1.0
    max_factor: float = 100.0
    columnwise: ClassVar[bool] = True

    def __post_init__(self):
        if not self.exponent >= 0:
            raise ValueError("jct.exponent must be >= 0")
        if not self.max_factor >= 1:
            raise ValueError("jct.max_factor must be >= 1")

    def apply(self, data, builder, weight: float) -> None:
        if data.n_jobs == 0:
            return
        t = np.maximum(data.remaining_time_ref_s, 1e-9)
        factor = (median(t) / t) ** self.exponent
        factor = np.clip(factor, 1.0 / self.max_factor, self.max_factor)
        builder.add_x_objective(weight * data.speedup * factor[data.col_job])
