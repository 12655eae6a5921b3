"""Goodput estimates for the Sia artifact's adaptive-batch jobs (instances/goodput.py).

``GoodputModel`` is the performance model the policies decide with on ``sia:``
instances: a job's goodput (progress per second) on a shape, at its current epoch, with
the batch it would choose there. It reads the artifact's measured profiles and
validation curves through the same functions as the truth (``SiaWorld``): the estimate
of a configuration the scheduler looks at is what that configuration really gives.
This is "perfect profiling": Sia and Pollux instead fit Pollux's throughput model
(compute, all-reduce and their overlap, seven parameters) to the configurations each
job has run on, and use the gradient statistics the job last measured; what the
scheduler is allowed to *know* (which GPU types a job has been profiled on, how far it
may grow) is the policies' business (engine/decide/policies/sia_goodput.py). A named
simplification, measured in docs/results/2026-12-04-sia-fidelity.md.

``estimate(job, grid)`` (the ``PerformanceModel`` seam, for the move ledger and the
generic runner) gives the rate at the job's start; the policies call ``goodput``.
"""
from __future__ import annotations

import numpy as np

from instances.errors import InputError
from instances.goodput import ADAPTIVE, BatchPlan, GoodputJob, Segment, SiaWorld
from instances.grid import Grid, Shape
from instances.jobs import Job

from .base import Estimate


class GoodputModel:
    name = "sia-profiles"
    runtime = "sia"

    def __init__(self, world: SiaWorld):
        self.world = world

    def goodput(self, job: GoodputJob, shape: Shape, progress: float,
                plan: BatchPlan | None = None) -> Segment | None:
        """The job's rate (and batch) on ``shape`` from ``progress``; None: it cannot run there."""
        return self.world.segment(job, shape, progress, plan or ADAPTIVE)

    def estimate(self, job: Job, grid: Grid) -> Estimate:
        if not isinstance(job, GoodputJob):
            raise InputError(f"the {self.name} model estimates only the Sia artifact's goodput jobs, not job "
                             f"{job.job_id} ({job.model})", field="--perf")
        seg = self.goodput(job, grid.shape, 0.0)
        if seg is None:
            return Estimate(float("inf"), 0.0, 0.0, None, feasible=False, source=self.name)
        return Estimate(seg.seconds_per_unit, job.global_batch / seg.seconds_per_unit, 0.0, None, source=self.name,
                        notes=(f"batch {seg.batch}",))


# -- Pollux's throughput model, fitted to what a job has run on ------------------------
#
# Pollux (OSDI'21, section 3.2) models one iteration on ``n`` nodes and ``r`` replicas at
# per-GPU batch ``b`` with ``a`` accumulation steps as ``a * T_acc + T_opt`` with
# ``T_acc = alpha_c + beta_c b`` (compute), a network term ``T_net = alpha + beta max(r - 2,
# 0)`` (inter-node parameters when ``n > 1``, intra-node when ``r > 1``, none for one GPU)
# and their overlap ``T_opt = (T_acc^gamma + T_net^gamma)^(1 / gamma)``, ``gamma`` in [1, 10].
# The seven parameters are fitted to the measured (step, all-reduce) times of the
# configurations the job has run on: least squares of the logs of compute and step time,
# with small penalties towards ``gamma = 1`` and against the retrogression terms, and the
# parameters no observation can inform held at their bounds (Pollux's rules: one batch
# seen fixes alpha_c at half the compute time; no multi-node run fixes the inter-node
# terms, no multi-GPU single-node run the intra-node ones, no run on more than 2 GPUs
# both beta terms; without multi-node runs the inter-node terms are then set at least
# 1.1 x the intra-node ones).

PARAMS0 = np.array([1e-1, 1e-2, 1e-1, 1e-2, 1e-1, 1e-2, 1.0 + 1e-3])
LOWER = np.array([1e-8] * 6 + [1.0])
UPPER = np.array([np.inf] * 6 + [10.0])


def _net(p: np.ndarray, nodes: np.ndarray, replicas: np.ndarray) -> np.ndarray:
    inter, intra = nodes > 1, (nodes == 1) & (replicas > 1)
    alpha = np.where(inter, p[2], np.where(intra, p[4], 1e-8))
    beta = np.where(inter, p[3], np.where(intra, p[5], 1e-8))
    return alpha + beta * np.maximum(replicas - 2, 1e-8)


def _log_opt(p: np.ndarray, acc: np.ndarray, net: np.ndarray) -> np.ndarray:
    g = p[6]
    return np.log(acc ** g + net ** g) / g


def fit_throughput(points: list[tuple[int, int, int, float, float]]) -> np.ndarray:
    """Pollux's seven parameters from (nodes, replicas, per-GPU batch, step s, all-reduce s)."""
    from scipy.optimize import minimize
    a = np.array(points, dtype=float)
    nodes, reps, bsz, step, sync = a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4]
    comp = np.maximum(step - sync, 1e-8)
    lo, hi, p0 = LOWER.copy(), UPPER.copy(), PARAMS0.copy()
    if len(np.unique(bsz)) == 1:
        p0[0] = lo[0] = hi[0] = float(np.mean(comp)) / 2
    fixed = np.zeros(7, dtype=bool)
    fixed[0] = len(np.unique(bsz)) == 1
    if not np.any(nodes > 1):
        fixed[[2, 3]] = True
    if not np.any((nodes == 1) & (reps > 1)):
        fixed[[4, 5]] = True
    if not np.any(reps > 2):
        fixed[[3, 5]] = True
    for i in np.flatnonzero(fixed):
        if i != 0:
            p0[i] = lo[i] = hi[i] = LOWER[i]
    free = np.flatnonzero(~fixed)

    def objective(x: np.ndarray) -> float:
        p = p0.copy()
        p[free] = x
        acc = p[0] + p[1] * bsz
        lopt = _log_opt(p, acc, _net(p, nodes, reps))
        err1 = np.sqrt(np.mean((np.log(acc) - np.log(comp)) ** 2))
        err2 = np.sqrt(np.mean((lopt - np.log(step)) ** 2))
        reg = 1e-3 * (p[6] - 1) ** 2 + 1e-2 * ((p[3] / p[2]) ** 2 + (p[5] / p[4]) ** 2)
        return float(err1 + err2 + reg)

    p = p0.copy()
    if len(free):
        res = minimize(objective, p0[free], method="L-BFGS-B", bounds=list(zip(lo[free], hi[free])),
                       options={"ftol": 1e-10, "maxiter": 500})
        p[free] = res.x
    if not np.any(nodes > 1):
        p[2] = max(p[2], p[4] * 1.1)
        p[3] = max(p[3], p[5] * 1.1)
    return p


def fitted_iteration_time(p: np.ndarray, nodes: int, replicas: int, atomic: np.ndarray,
                          accum: np.ndarray) -> np.ndarray:
    acc = p[0] + p[1] * atomic
    net = _net(p, np.full_like(acc, nodes), np.full_like(acc, replicas))
    return accum * acc + np.exp(_log_opt(p, acc, net))


def fitted_goodput(p: np.ndarray, grad: tuple[float, float], init_batch: int, nodes: int, replicas: int,
                   max_batch: int, min_local: int, max_local: int) -> float:
    """The best goodput (samples/s x statistical efficiency) over Pollux's 50 batch sizes,
    as its ``optimize`` with accumulation: 0 when none is valid."""
    sqr, var = grad
    lo = max(init_batch, min_local * replicas)
    batch = np.geomspace(lo, max_batch, 50) if max_batch > lo else np.array([float(lo)])
    local = batch / replicas
    accum = np.ceil(local / max_local - 1e-8) - 1
    accum = np.where((replicas == 1) & (local > init_batch + 1e-8), np.maximum(accum, 1), accum)
    atomic = np.ceil(local / (accum + 1) - 1e-8)
    t = fitted_iteration_time(p, nodes, replicas, atomic, accum)
    real = replicas * atomic * (accum + 1)
    scale = real / init_batch
    denom = var / scale + sqr
    gain = np.where(denom > 0, (var + sqr) / np.where(denom > 0, denom, 1.0), 1.0)
    good = real / t * gain / scale
    good = np.where((min_local <= atomic) & (atomic <= max_local), good, 0.0)
    return float(good.max()) if len(good) else 0.0
