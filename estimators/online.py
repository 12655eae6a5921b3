"""The ``online`` performance model: a base model corrected, per job, by the iteration
times measured while the job runs (non-intrusive profiling: nothing is run for it).

``observe(job_id, grid, iteration_time_s, iterations)`` adds ``iterations`` measured
iterations averaging ``iteration_time_s`` on ``grid`` (the engine's round loop feeds
every running job's new measurements each round; engine/online_feed.py). Then, for that
job (docs/estimators.md, "Online profiling", states the rule):

- on a grid it ran ``min_iterations`` or more iterations on: the observed mean;
- on any other grid (more or fewer GPUs, another pipeline depth, node shape or GPU
  type), the base estimate times a correction fitted to the job's observations. The base
  estimate is split, with the analytic composition of its proxy plan, into a compute
  part (layer compute, pipeline bubble, optimizer, step overhead) and a communication
  part (tensor-parallel collectives, pipeline sends, exposed gradient all-reduce); the
  correction is ``(1 - s) a + s c`` for the grid's communication share ``s``, with
  ``a`` (compute factor) and ``c`` (communication factor) fitted by least squares to the
  observed/estimated ratios when the observations span communication shares at least
  ``min_share_spread`` apart, else ``a = c`` = their (iteration-weighted) geometric
  mean. Observations on the queried grid's GPU type are used when there are any, else
  all. With fewer than ``min_iterations`` iterations in total the correction is shrunk
  towards 1: ``correction ** (n / min_iterations)``.

Estimates of a job without observations are the base model's (shared by every job of
the same model and batch); ``estimate_key(job)`` changes whenever the job's estimates
may have, so callers that memoize estimates (engine/formulation/round_data.py) never
serve stale ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable

import numpy as np

from instances.errors import InputError
from instances.grid import Grid
from instances.jobs import Job

from .analytic import AnalyticModel
from .base import Estimate, PerformanceModel

COMM_PARTS = ("tp_comm", "p2p", "dp_exposed")     # Breakdown.shares() keys the factor ``c`` scales


@dataclass
class _Seen:
    iterations: float = 0.0
    seconds: float = 0.0                          # sum of iteration times

    @property
    def mean_s(self) -> float:
        return self.seconds / self.iterations


class ObservationStore:
    """Measured iterations per (job, grid), with a version per job that changes on every
    observation. Shared by an online model and its data-parallel-only twin."""

    def __init__(self) -> None:
        self._seen: dict[str, dict[Grid, _Seen]] = {}
        self._version: dict[str, int] = {}

    def add(self, job_id: str, grid: Grid, iteration_time_s: float, iterations: float) -> None:
        if not isinstance(grid, Grid):
            raise InputError(f"expected a Grid, got {grid!r}", field="grid")
        for name, v in (("iteration_time_s", iteration_time_s), ("iterations", iterations)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InputError(f"must be a positive finite number, got {v!r}", field=name)
        s = self._seen.setdefault(job_id, {}).setdefault(grid, _Seen())
        s.iterations += float(iterations)
        s.seconds += float(iterations) * float(iteration_time_s)
        self._version[job_id] = self._version.get(job_id, 0) + 1

    def of(self, job_id: str) -> dict[Grid, _Seen]:
        return self._seen.get(job_id, {})

    def version(self, job_id: str) -> int:
        return self._version.get(job_id, 0)


def _analytic_of(model: PerformanceModel) -> AnalyticModel | None:
    """The analytic model whose proxy plans a base model's estimates follow (analytic
    itself; ``learned`` and ``table`` keep one as ``.analytic``)."""
    return model if isinstance(model, AnalyticModel) else getattr(model, "analytic", None)


class OnlineModel:
    """PerformanceModel and ``LearnsOnline``: ``base`` corrected per job by what its runs
    measured (module docstring)."""
    kind = "online"

    def __init__(self, *, base: str | PerformanceModel = "auto", min_iterations: float = 20,
                 min_share_spread: float = 0.1, dp_only: bool = False, store: ObservationStore | None = None,
                 **base_config):
        if not (isinstance(min_iterations, (int, float)) and min_iterations >= 1):
            raise InputError(f"must be >= 1, got {min_iterations!r}", field="min_iterations")
        if not (isinstance(min_share_spread, (int, float)) and 0 < min_share_spread <= 1):
            raise InputError(f"must be in (0, 1], got {min_share_spread!r}", field="min_share_spread")
        from .perf import make_performance_model
        if isinstance(base, str):
            if base == "online":
                raise InputError("the online model's base cannot be online", field="base")
            if base == "auto":       # learned when a learned artifact is given, else analytic
                base = "learned" if base_config.get("artifact") is not None else "analytic"
            self.base_kind = base
            base = make_performance_model(base, dp_only=dp_only, **base_config)
        elif base_config:
            raise InputError(f"base options {sorted(base_config)} need a base kind, not a model", field="base")
        else:
            self.base_kind = getattr(base, "kind", None)
        self.base: PerformanceModel = base
        self.base_config = base_config
        self.analytic = _analytic_of(base)
        self.dp_only = bool(dp_only)
        self.min_iterations, self.min_share_spread = float(min_iterations), float(min_share_spread)
        self.store = store if store is not None else ObservationStore()
        self.name = f"online({base.name})"
        self._twin: OnlineModel | None = None

    # -- LearnsOnline ------------------------------------------------------------------
    def observe(self, job_id: str, grid: Grid, iteration_time_s: float, iterations: float) -> None:
        """``iterations`` iterations of ``job_id`` measured on ``grid``, ``iteration_time_s`` each on average."""
        self.store.add(job_id, grid, iteration_time_s, iterations)

    def estimate_key(self, job: Job) -> Hashable | None:
        """None while ``job`` has no observations (its estimates are the base model's,
        shared by its model and batch); else a key that changes with every observation."""
        v = self.store.version(job.job_id)
        return None if v == 0 else (job.job_id, v)

    def dp_only_twin(self) -> "OnlineModel":
        """The data-parallel-only twin (baselines): same observations, dp-only base."""
        if self.dp_only:
            return self
        if self._twin is None:
            base = self.base_kind if self.base_kind is not None else "table"
            self._twin = OnlineModel(base=base, min_iterations=self.min_iterations,
                                     min_share_spread=self.min_share_spread, dp_only=True, store=self.store,
                                     **self.base_config)
        return self._twin

    # -- PerformanceModel ----------------------------------------------------------------
    def estimate(self, job: Job, grid: Grid) -> Estimate:
        b = self.base.estimate(job, grid)
        seen = self.store.of(job.job_id)
        if not seen or not b.feasible or not math.isfinite(b.iteration_time_s):
            return b
        own = seen.get(grid)
        if own is not None and own.iterations >= self.min_iterations:
            t = own.mean_s
            return Estimate(t, job.global_batch / t, b.peak_memory_bytes, b.plan, True,
                            f"{self.name}/observed",
                            b.notes + (f"mean of {own.iterations:g} measured iterations",))
        fit = self.factors(job, grid.gpu_type)
        if fit is None:
            return b
        a, c, n = fit
        s = self.comm_share(job, grid)
        k = ((1.0 - s) * a + s * c) ** min(1.0, n / self.min_iterations)
        t = b.iteration_time_s * k
        return Estimate(t, job.global_batch / t, b.peak_memory_bytes, b.plan, True, f"{self.name}/corrected",
                        b.notes + (f"online correction x{k:.3f} (compute x{a:.3f}, communication x{c:.3f}, "
                                   f"from {n:g} measured iterations)",))

    # -- the correction --------------------------------------------------------------------
    def comm_share(self, job: Job, grid: Grid) -> float:
        """Communication share of the base model's proxy plan on ``grid`` (0 when the base
        has no analytic composition)."""
        if self.analytic is None:
            return 0.0
        r = self.analytic.plan_result(job, grid)
        if r is None:
            return 0.0
        sh = r.breakdown.shares()
        return min(1.0, max(0.0, sum(sh[p] for p in COMM_PARTS)))

    def factors(self, job: Job, gpu_type: str) -> tuple[float, float, float] | None:
        """(compute factor a, communication factor c, iterations they rest on) fitted to
        ``job``'s observations (those on ``gpu_type`` when there are any); None without
        usable observations."""
        rows = []
        for g, s in self.store.of(job.job_id).items():
            b = self.base.estimate(job, g)
            if b.feasible and math.isfinite(b.iteration_time_s) and b.iteration_time_s > 0:
                rows.append((g.gpu_type == gpu_type, s.mean_s / b.iteration_time_s, self.comm_share(job, g),
                             s.iterations))
        if any(r[0] for r in rows):
            rows = [r for r in rows if r[0]]
        if not rows:
            return None
        ratio = np.array([r[1] for r in rows])
        share = np.array([r[2] for r in rows])
        w = np.array([r[3] for r in rows])
        n = float(w.sum())
        if share.max() - share.min() >= self.min_share_spread:
            X = np.stack([1.0 - share, share], axis=1) * np.sqrt(w)[:, None]
            (a, c), *_ = np.linalg.lstsq(X, ratio * np.sqrt(w), rcond=None)
            if a > 0 and c > 0:
                return float(a), float(c), n
        g = float(np.exp(np.average(np.log(ratio), weights=w)))
        return g, g, n
