"""Fairness over normalized shares s_j = sum_g speedup(j, g) x[j, g].

- ``kind="maxmin"``: a variable t <= s_j for every job (the jobs of the round), and
  weight * n_jobs * t in the objective (scaled like a sum over jobs). With more jobs
  than fit, t is 0; use it where every job can run (Gavel-style shares) or with
  ``only_running``.
- ``kind="power"``: sum_j s_j ** p with 0 < p < 1 (concave: diminishing returns, the
  alpha-fair family), by a piecewise-linear approximation: u_j <= a_k s_j + b_k for
  ``segments`` chords of s**p over [0, max share]. Chords under-estimate a concave
  function, so the model never overstates fairness; the error shrinks with segments.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import register_term

KINDS = ("maxmin", "power")


@register_term("fairness")
@dataclass(frozen=True)
class Fairness:
    kind: str = "power"
    p: float = 0.5
    segments: int = 6

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"fairness.kind must be one of {KINDS}, got {self.kind!r}")
        if not 0 < self.p < 1:
            raise ValueError("fairness.p must be in (0, 1)")
        if self.segments < 1:
            raise ValueError("fairness.segments must be >= 1")

    def apply(self, data, builder, weight: float) -> None:
        n = data.n_jobs
        if n == 0:
            return
        s = data.speedup
        share_max = np.zeros(n)
        np.maximum.at(share_max, data.col_job, s)
        if self.kind == "maxmin":
            t = builder.add_var(0.0, float(share_max.max()), weight * n, "fair_t")
            rows = np.concatenate([np.arange(n), data.col_job])
            cols = np.concatenate([np.full(n, t), np.arange(data.n_cols)])
            vals = np.concatenate([np.ones(n), -s])
            builder.add_rows(rows, cols, vals, -np.inf, 0.0, [f"fair_{i}" for i in data.job_ids])
            return
        # power mean: breakpoints 0 = z_0 < ... < z_K = share_max, chords of z**p
        K = self.segments
        u = builder.add_vars(np.zeros(n), share_max ** self.p, np.full(n, weight), "fair_u")
        rows_r, rows_c, rows_v, ub, names = [], [], [], [], []
        r = 0
        z = share_max[:, None] * (np.arange(K + 1)[None, :] / K) ** 2   # denser near 0
        f = z ** self.p
        for k in range(K):
            dz = z[:, k + 1] - z[:, k]
            slope = np.where(dz > 0, (f[:, k + 1] - f[:, k]) / np.where(dz > 0, dz, 1), 0.0)
            icpt = f[:, k] - slope * z[:, k]
            # u_j - slope_j * sum_g s_jg x_jg <= icpt_j
            rows_r.append(r + np.arange(n)); rows_c.append(u); rows_v.append(np.ones(n))
            rows_r.append(r + data.col_job); rows_c.append(np.arange(data.n_cols))
            rows_v.append(-slope[data.col_job] * s)
            ub.append(icpt)
            names.extend(f"fairpw{k}_{i}" for i in data.job_ids)
            r += n
        builder.add_rows(np.concatenate(rows_r), np.concatenate(rows_c), np.concatenate(rows_v),
                         -np.inf, np.concatenate(ub), names)
