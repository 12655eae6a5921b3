"""Fit the ``online`` model's prior (``estimators.online.OnlinePrior``) to how a base
model's errors co-vary across grids and jobs, on the Arena measured table.

For every feasible measured row, ``x = log(measured / base estimate)`` on the row's shape
at the pipeline depth the base model prefers (the grid a policy would run it on); a job
is a (model, global batch). For every pair of rows of the same job — a row with itself
included — and every pair of rows of two jobs on the same resource shape, ``x_i * x_j``
estimates the prior covariance of the pair; a non-negative least-squares fit of these
products on the covariance's parts (same job: 1, same GPU type, same shape, ``s_i *
s_j``; same shape: 1, same family, same model) gives the squared standard deviations
(method of moments). The table holds one grid per shape, so the ``shape`` part also
takes what a ``grid`` part would (``grid`` is reported as 0). ``cross_job=False`` fits the
job's own parts alone (pairs of the same job only; the shared parts 0).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from instances.grid import Grid, Shape
from instances.jobs import Job
from instances.measurements import load_measured_iter_times

from ..online import OnlinePrior
from ..perf import make_performance_model


@dataclass(frozen=True)
class Point:
    """One measured row seen by the base model."""
    model: str
    global_batch: int
    family: str
    grid: Grid
    log_error: float
    comm_share: float


def measured_points(base: str = "analytic", rows=None, online=None) -> list[Point]:
    """The base model's log error on every feasible measured row (``rows``: the Arena
    measured table by default), at the pipeline depth it prefers."""
    online = online or make_performance_model("online", base=base)
    rows = [r for r in (load_measured_iter_times() if rows is None else rows) if r.iter_time_s is not None]
    out = []
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
        if best is not None:
            out.append(Point(r.model, r.global_batch, online.family(r.model), best[1],
                             math.log(r.iter_time_s / best[0]), online.comm_share(job, best[1])))
    return out


def fit_prior_to_points(points: list[Point], cross_job: bool = True,
                        iteration_cv: float = OnlinePrior.iteration_cv) -> tuple[OnlinePrior, dict]:
    """(fitted prior, diagnostics) from ``points`` (``measured_points``)."""
    A, y = [], []
    for i, a in enumerate(points):
        for b in points[i:]:
            same_job = (a.model, a.global_batch) == (b.model, b.global_batch)
            same_shape = a.grid.shape == b.grid.shape
            if not same_job and not (cross_job and same_shape):
                continue
            own = (1.0, float(a.grid.gpu_type == b.grid.gpu_type), float(same_shape), a.comm_share * b.comm_share)
            shared = (float(same_shape), float(same_shape and a.family == b.family),
                      float(same_shape and a.model == b.model))
            A.append((own if same_job else (0.0,) * 4) + (shared if cross_job else ()))
            y.append(a.log_error * b.log_error)
    sq, resid = nnls(np.array(A), np.array(y))
    sd = [math.sqrt(max(v, 0.0)) for v in sq] + [0.0] * (7 - len(sq))
    prior = OnlinePrior(job=sd[0], type=sd[1], shape=sd[2], grid=0.0, comm=sd[3], shared_shape=sd[4],
                        shared_family=sd[5], shared_model=sd[6], iteration_cv=iteration_cv)
    xs = np.array([p.log_error for p in points])
    return prior, {"rows": int(len(xs)), "jobs": len({(p.model, p.global_batch) for p in points}),
                   "pairs": len(y), "rms_log_error": float(np.sqrt(np.mean(xs ** 2))), "nnls_residual": float(resid)}


def fit_online_prior(base: str = "analytic", rows=None, iteration_cv: float = OnlinePrior.iteration_cv,
                     cross_job: bool = True) -> tuple[OnlinePrior, dict]:
    """(fitted prior, diagnostics) for ``base`` on the measured table (or ``rows``)."""
    return fit_prior_to_points(measured_points(base, rows), cross_job, iteration_cv)
