"""Fit the ``online`` model's prior (``estimators.online.OnlinePrior``) to how a base
model's errors co-vary across the grids of one job, on the Arena measured table.

For every feasible measured row, ``x = log(measured / base estimate)`` on the row's shape
at the pipeline depth the base model prefers (the grid a policy would run it on). For
every pair of rows of the same (model, global batch) — a row with itself included —
``x_i * x_j`` estimates the prior covariance of their grids; a non-negative least-squares
fit of these products on the covariance's parts (1, same GPU type, same shape,
``s_i * s_j``) gives the squared standard deviations (method of moments). The table
holds one grid per shape, so the ``shape`` part also takes what a ``grid`` part would
(``grid`` is reported as 0).
"""
from __future__ import annotations

import math

import numpy as np
from scipy.optimize import nnls

from instances.grid import Grid, Shape
from instances.jobs import Job
from instances.measurements import load_measured_iter_times

from ..online import OnlinePrior
from ..perf import make_performance_model


def fit_online_prior(base: str = "analytic", rows=None, iteration_cv: float = OnlinePrior.iteration_cv
                     ) -> tuple[OnlinePrior, dict]:
    """(fitted prior, diagnostics) for ``base`` on the measured table (or ``rows``)."""
    online = make_performance_model("online", base=base)
    rows = [r for r in (load_measured_iter_times() if rows is None else rows) if r.iter_time_s is not None]
    groups: dict[tuple, list] = {}
    for r in rows:
        job = Job("fit", r.model, r.global_batch, 1, 0.0)
        shape = Shape(r.gpu_type, r.num_nodes, r.gpus_per_node)
        best = None
        for pp in range(1, shape.num_gpus + 1):
            if shape.num_gpus % pp:
                continue
            e = online.base.estimate(job, Grid(shape, pp))
            if e.feasible and math.isfinite(e.iteration_time_s) and (best is None or e.iteration_time_s < best[0]):
                best = (e.iteration_time_s, Grid(shape, pp))
        if best is None:
            continue
        groups.setdefault((r.model, r.global_batch), []).append(
            (best[1], math.log(r.iter_time_s / best[0]), online.comm_share(job, best[1])))
    A, y = [], []
    for g in groups.values():
        for i in range(len(g)):
            for j in range(i, len(g)):
                (gi, xi, si), (gj, xj, sj) = g[i], g[j]
                A.append((1.0, float(gi.gpu_type == gj.gpu_type), float(gi.shape == gj.shape), si * sj))
                y.append(xi * xj)
    sq, resid = nnls(np.array(A), np.array(y))
    job, typ, shape, comm = (math.sqrt(max(v, 0.0)) for v in sq)
    xs = np.array([x for g in groups.values() for _, x, _ in g])
    prior = OnlinePrior(job=job, type=typ, shape=shape, grid=0.0, comm=comm, iteration_cv=iteration_cv)
    return prior, {"rows": int(len(xs)), "groups": len(groups), "pairs": len(y),
                   "rms_log_error": float(np.sqrt(np.mean(xs ** 2))), "nnls_residual": float(resid)}
