"""Least attained service: favour jobs that have received less so far (Gavel-style
round-based fairness, which realizes max-min shares over time by priority).

Coefficient of x[j, g] = speedup(j, g) * ((A_mean + tau) / (A_j + tau)) ** exponent,
A_j the GPU-seconds job j received so far, A_mean their mean over the round's jobs,
tau = ``tau_gpu_s`` (smooths newcomers); the factor is clipped to [1/max_factor, max_factor].
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import register_term


@register_term("las")
@dataclass(frozen=True)
class LeastAttainedService:
    exponent: float = 1.0
    tau_gpu_s: float = 3600.0
    max_factor: float = 100.0
    columnwise: ClassVar[bool] = True

    def __post_init__(self):
        if not self.exponent >= 0 or not self.tau_gpu_s > 0 or not self.max_factor >= 1:
            raise ValueError("las: exponent >= 0, tau_gpu_s > 0, max_factor >= 1 required")

    def apply(self, data, builder, weight: float) -> None:
        if data.n_jobs == 0:
            return
        att = data.attained_gpu_s if data.attained_gpu_s is not None else np.zeros(data.n_jobs)
        f = ((att.mean() + self.tau_gpu_s) / (att + self.tau_gpu_s)) ** self.exponent
        f = np.clip(f, 1.0 / self.max_factor, self.max_factor)
        builder.add_x_objective(weight * data.speedup * f[data.col_job])
