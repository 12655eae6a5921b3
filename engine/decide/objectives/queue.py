"""A penalty per queued job, growing with the time it has waited.

Penalty(j) = 1 + queued_s / aging_s (aging off when ``aging_s`` is 0), charged when
job j gets no grid. Written as a bonus on every column of j (the constant -sum of
penalties goes to the model offset), so it adds no variables.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import register_term


@register_term("queue")
@dataclass(frozen=True)
class QueuePenalty:
    aging_s: float = 0.0
    columnwise: ClassVar[bool] = True

    def __post_init__(self):
        if not self.aging_s >= 0:
            raise ValueError("queue.aging_s must be >= 0")

    def apply(self, data, builder, weight: float) -> None:
        pen = np.ones(data.n_jobs)
        if self.aging_s > 0:
            pen = pen + data.queued_s / self.aging_s
        builder.add_x_objective(weight * pen[data.col_job])
        builder.offset -= weight * float(pen.sum())
