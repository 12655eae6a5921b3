"""Fit the global efficiency factors of ``EfficiencyConfig`` to measured iteration times.

One small set of global constants (compute efficiency of transformer, MoE and
convolution layers; HBM, intra- and inter-node link bandwidth efficiencies) is fitted by
minimising the squared log error of the analytic model's best-grid estimate over the
given rows (scipy Powell search in log space). No per-row or per-GPU-type
factor exists: a GPU type enters only through its catalog specs.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np

from instances.grid import Shape

from ..config import EfficiencyConfig, EstimatorConfig, arena_runtime
from ..planner import Planner, best_shape_result
from ..reference import MeasuredRow

# Parameters that can be fitted; conv kinds and embedding/head share one factor each.
FITTABLE = ("decoder", "moe_decoder", "conv", "inter_bw_efficiency", "intra_bw_efficiency",
            "memory_bw_efficiency")
FIT_PARAMS = FITTABLE        # fitted by default, in this order


# A neutral starting point (typical values, not fitted on any row) for refits that must
# not start from constants fitted on their own test rows (leave-one-GPU-type-out).
NEUTRAL_START = {"decoder": 0.5, "moe_decoder": 0.5, "conv": 0.5, "inter_bw_efficiency": 0.1,
                 "intra_bw_efficiency": 0.5, "memory_bw_efficiency": 0.5}


def neutral_start(eff: EfficiencyConfig) -> EfficiencyConfig:
    """``eff`` with the fitted constants reset to ``NEUTRAL_START``."""
    return apply_params(eff, [math.log(NEUTRAL_START[p]) for p in FIT_PARAMS], FIT_PARAMS)


def apply_params(base: EfficiencyConfig, theta, params: tuple[str, ...] = FIT_PARAMS) -> EfficiencyConfig:
    """``base`` with the named ``params`` set to ``exp(theta)`` (clipped to (0.001, 1])."""
    if len(theta) != len(params):
        raise ValueError(f"{len(theta)} values for {len(params)} parameters {params}")
    v = {p: float(min(1.0, max(1e-3, math.exp(x)))) for p, x in zip(params, theta)}
    kinds = {}
    if "decoder" in v:
        kinds.update(decoder=v["decoder"], embedding=v["decoder"], head=v["decoder"])
    if "moe_decoder" in v:
        kinds["moe_decoder"] = v["moe_decoder"]
    if "conv" in v:
        kinds.update(conv_stem=v["conv"], bottleneck=v["conv"], classifier=v["conv"])
    eff = base.with_kind_efficiency(**kinds) if kinds else base
    links = {p: v[p] for p in ("inter_bw_efficiency", "intra_bw_efficiency", "memory_bw_efficiency") if p in v}
    return replace(eff, **links)


def _theta(eff: EfficiencyConfig, params: tuple[str, ...] = FIT_PARAMS) -> np.ndarray:
    get = {"decoder": lambda: eff.compute_efficiency("decoder"),
           "moe_decoder": lambda: eff.compute_efficiency("moe_decoder"),
           "conv": lambda: eff.compute_efficiency("bottleneck")}
    for p in params:
        if p not in FITTABLE:
            raise ValueError(f"unknown fit parameter {p!r}; known: {', '.join(FITTABLE)}")
    return np.log([get[p]() if p in get else getattr(eff, p) for p in params])


def ratios(cfg: EstimatorConfig, rows: list[MeasuredRow]) -> list[float | None]:
    """Best-shape estimate / measured time of every measured (non-OOM) row; None where the
    estimator finds no feasible plan."""
    planner = Planner(cfg)
    out = []
    for r in rows:
        if r.iter_time_s is None:
            continue
        res = best_shape_result(planner, r.model, r.global_batch, Shape(r.gpu_type, r.num_nodes, r.gpus_per_node))
        out.append(res.iteration_time_s / r.iter_time_s if res else None)
    return out


def log_errors(cfg: EstimatorConfig, rows: list[MeasuredRow]) -> np.ndarray:
    # an infeasible prediction of a measured row counts as a factor-2 miss
    return np.asarray([math.log(q) if q is not None else math.log(2.0) for q in ratios(cfg, rows)])


# Data-independent corner starts of the link and memory efficiencies for multi-start
# fits: the loss has several basins (from NEUTRAL_START alone Powell stops at a mean
# squared log error of 0.044 in-sample, where the shipped constants reach 0.037).
CORNER_VALUES = {"intra_bw_efficiency": (0.05, 0.5), "inter_bw_efficiency": (0.03, 0.3),
                 "memory_bw_efficiency": (0.05, 0.5)}


def corner_starts(eff: EfficiencyConfig, params: tuple[str, ...] = FIT_PARAMS) -> list[EfficiencyConfig]:
    """``eff`` with every combination of ``CORNER_VALUES`` for the fitted link and memory
    efficiencies (the other constants as in ``eff``)."""
    names = [p for p in CORNER_VALUES if p in params]
    out = []
    for values in itertools.product(*(CORNER_VALUES[p] for p in names)):
        out.append(apply_params(eff, [math.log(v) for v in values], tuple(names)))
    return out


def max_starts() -> int:
    """How many starts ``fit_efficiency`` has to run from: the base and its corner starts."""
    return 1 + len(corner_starts(arena_runtime().efficiency))


def fit_efficiency(rows: list[MeasuredRow], base: EstimatorConfig | None = None, *,
                   max_evals: int = 80, params: tuple[str, ...] = FIT_PARAMS, starts: int = 1) -> EfficiencyConfig:
    """Powell search over the log of ``params`` minimising the mean squared log error of
    the rows' best-shape estimates; starts from ``base``'s values (default: the defaults
    under the Arena runtime, ``config.arena_runtime``, which produced the measured table).
    ``starts`` > 1: multi-start — the loss is evaluated at ``base`` and at its
    ``corner_starts``, Powell runs from the ``starts`` best of them (``max_evals`` each),
    and the best result is returned."""
    from scipy.optimize import minimize
    base = base or arena_runtime()

    def loss_at(eff):
        e = log_errors(replace(base, efficiency=eff), rows)
        return float(np.mean(e ** 2))

    def loss(theta):
        return loss_at(apply_params(base.efficiency, theta, params))

    candidates = [base.efficiency]
    if starts > 1:
        candidates += corner_starts(base.efficiency, params)
        candidates = sorted(candidates, key=loss_at)[:starts]
    best, best_loss = None, math.inf
    for eff in candidates:
        res = minimize(loss, _theta(eff, params), method="Powell",
                       options={"maxfev": max_evals, "xtol": 1e-2, "ftol": 1e-4})
        if res.fun < best_loss:
            best, best_loss = apply_params(base.efficiency, res.x, params), res.fun
    return best
