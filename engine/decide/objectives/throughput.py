"""Normalized throughput: each job's speedup over its reference allocation.

Raw samples/s do not compare across models (a small model's samples are cheap), so the
coefficient of x[j, g] is throughput(j, g) / throughput(j, reference), the reference
being the GPU type and count the user asked for (see round_data._reference_throughput),
times the job's priority when ``use_priority``. ``reference="smallest"`` measures the
speedup over the job's smallest feasible allocation instead (Sia's normalization).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import register_term


@register_term("throughput")
@dataclass(frozen=True)
class NormalizedThroughput:
    use_priority: bool = True
    reference: str = "requested"

    def __post_init__(self):
        if self.reference not in ("requested", "smallest"):
            raise ValueError(f"throughput.reference must be 'requested' or 'smallest', got {self.reference!r}")

    @property
    def columnwise(self) -> bool:
        return self.reference == "requested"   # the smallest reference reads every column of a job

    def apply(self, data, builder, weight: float) -> None:
        coef = data.speedup if self.reference == "requested" else smallest_speedup(data)
        if self.use_priority:
            coef = coef * data.priority[data.col_job]
        builder.add_x_objective(weight * np.asarray(coef, dtype=float))


def smallest_speedup(data) -> np.ndarray:
    """Per column: throughput over the job's throughput on its fewest-GPU column."""
    gpus = data.col_gpus
    min_g = np.full(data.n_jobs, np.iinfo(np.int64).max)
    np.minimum.at(min_g, data.col_job, gpus)
    at_min = gpus == min_g[data.col_job]
    ref = np.zeros(data.n_jobs)
    np.maximum.at(ref, data.col_job[at_min], data.col_throughput[at_min])
    return data.col_throughput / ref[data.col_job]
