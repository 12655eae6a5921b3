"""Fit the global efficiency factors of ``EfficiencyConfig`` to measured iteration times.

One small set of global constants (per layer-kind compute efficiency, link efficiencies)
is fitted by minimising the squared log error of the analytic model's best-grid estimate
over the given rows (scipy Powell search in log space). No per-row or per-GPU-type
factor exists: a GPU type enters only through its catalog specs.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from instances.grid import Grid, Shape
from instances.jobs import Job

from .config import EfficiencyConfig, EstimatorConfig
from .planner import Planner, PlanResult
from .reference import MeasuredRow

# Parameters fitted, in this order; conv kinds and embedding/head share one factor each.
FIT_PARAMS = ("decoder", "moe_decoder", "conv", "inter_bw_efficiency", "intra_bw_efficiency")


def best_shape_result(planner: Planner, model: str, global_batch: int, shape: Shape, *,
                      dp_only: bool = False) -> PlanResult | None:
    """The fastest feasible proxy plan over the pipeline depths of one resource shape
    (the measured table holds the best plan the authors' search found for that shape)."""
    job = Job("row", model, global_batch, 1, 0.0)
    arch = job.arch
    best = None
    n = shape.num_gpus
    for pp in range(1, n + 1):
        if n % pp or pp > len(arch.layers()):
            continue
        r = planner.proxy(arch, global_batch, Grid(shape, pp), dp_only=dp_only)
        if r is None or not r.feasible:
            continue
        if best is None or r.iteration_time_s < best.iteration_time_s:
            best = r
    return best


def apply_params(base: EfficiencyConfig, theta) -> EfficiencyConfig:
    d, moe, conv, inter, intra = (float(min(1.0, max(1e-3, math.exp(x)))) for x in theta)
    eff = base.with_kind_efficiency(decoder=d, embedding=d, head=d, moe_decoder=moe, conv_stem=conv,
                                    bottleneck=conv, classifier=conv)
    return replace(eff, inter_bw_efficiency=inter, intra_bw_efficiency=intra)


def _theta(eff: EfficiencyConfig) -> np.ndarray:
    return np.log([eff.compute_efficiency("decoder"), eff.compute_efficiency("moe_decoder"),
                   eff.compute_efficiency("bottleneck"), eff.inter_bw_efficiency, eff.intra_bw_efficiency])


def log_errors(cfg: EstimatorConfig, rows: list[MeasuredRow]) -> np.ndarray:
    planner = Planner(cfg)
    out = []
    for r in rows:
        if r.iter_time_s is None:
            continue
        res = best_shape_result(planner, r.model, r.global_batch, Shape(r.gpu_type, r.num_nodes, r.gpus_per_node))
        # an infeasible prediction of a measured row counts as a factor-2 miss
        out.append(math.log(res.iteration_time_s / r.iter_time_s) if res else math.log(2.0))
    return np.asarray(out)


def fit_efficiency(rows: list[MeasuredRow], base: EstimatorConfig | None = None, *,
                   max_evals: int = 80) -> EfficiencyConfig:
    from scipy.optimize import minimize
    base = base or EstimatorConfig()

    def loss(theta):
        cfg = replace(base, efficiency=apply_params(base.efficiency, theta))
        e = log_errors(cfg, rows)
        return float(np.mean(e ** 2))

    res = minimize(loss, _theta(base.efficiency), method="Powell",
                   options={"maxfev": max_evals, "xtol": 1e-2, "ftol": 1e-4})
    return apply_params(base.efficiency, res.x)
