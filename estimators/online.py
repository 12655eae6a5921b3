"""The ``online`` performance model: a base model corrected, per job, by the iteration
times measured while the job runs (non-intrusive profiling: nothing is run for it).

``observe(job_id, grid, iteration_time_s, iterations)`` adds ``iterations`` measured
iterations averaging ``iteration_time_s`` on ``grid`` (the engine's round loop feeds
every running job's new measurements each round; engine/online_feed.py). Then, for that
job (docs/estimators.md, "Online profiling", states the rule):

- on a grid it ran ``min_iterations`` or more iterations on: the observed mean;
- on any other grid: the base estimate times ``exp(e)``, ``e`` the predicted log error
  of the base model on that grid given the job's observed log errors
  ``x_i = log(observed mean_i / base estimate_i)`` — the posterior mean of a Gaussian
  prior over the job's log errors (kriging) whose covariance between two grids is

      job² + type(t)²·[same GPU type t] + shape²·[same resource shape] + grid²·[same grid]
      + comm²·s·s'

  (``s``: the communication share — tensor-parallel collectives, pipeline sends, exposed
  gradient all-reduce — of the base model's proxy plan, from the analytic composition:
  the part of the error that scales with communication), each observation with
  measurement variance ``log(1 + iteration_cv²) / iterations``. One observed grid moves a
  neighbour by the fraction of the base model's error that neighbours share; the
  fractions (``OnlinePrior``) are fitted to how the base model's errors co-vary across
  grids of the same job (``estimators.evaluation.online_prior``) on the GPU types of the
  Arena measured table, which the base model's constants were fitted on. On any other
  type (``cpu`` ranks here, a new GPU) the base model's error is dominated by what the
  job and type share, so ``type(t)`` is ``new_type`` (large): one observed grid moves
  the type's other grids almost by the whole observed ratio.

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

COMM_PARTS = ("tp_comm", "p2p", "dp_exposed")     # Breakdown.shares() keys of the communication share


@dataclass(frozen=True)
class OnlinePrior:
    """Prior covariance of a job's log errors of the base model across grids (module
    docstring): standard deviations of the shared parts, in natural-log units. The
    defaults are ``estimators.evaluation.online_prior.fit_online_prior`` on the Arena
    measured table with the ``analytic`` base (``bench/bench_online.py --fit-prior``);
    ``new_type`` replaces ``type`` on GPU types outside ``OnlineModel.calibrated_types``
    (a stated default: log-sd 1, an error of a factor e either way is unremarkable on an
    uncalibrated device); ``iteration_cv`` is the assumed per-iteration jitter of measured
    step times."""
    job: float = 0.0
    type: float = 0.087
    new_type: float = 1.0
    shape: float = 0.229
    grid: float = 0.0
    comm: float = 0.465
    iteration_cv: float = 0.05

    def __post_init__(self):
        for f in ("job", "type", "new_type", "shape", "grid", "comm", "iteration_cv"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise InputError(f"must be a finite number >= 0, got {v!r}", field=f"prior.{f}")
        if self.job == self.type == self.shape == self.grid == self.comm == 0:
            raise InputError("at least one prior part must be > 0", field="prior")


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

    def __init__(self, *, base: str | PerformanceModel, min_iterations: float = 20,
                 prior: OnlinePrior | dict | None = None, dp_only: bool = False,
                 store: ObservationStore | None = None, calibrated_types: frozenset[str] | None = None,
                 make_base=None, **base_config):
        """``base``: a performance model, or a kind name that ``make_base(kind, dp_only=,
        **base_config)`` builds (``make_performance_model("online", ...)`` passes its
        factory and chooses the default base)."""
        if not (isinstance(min_iterations, (int, float)) and min_iterations >= 1):
            raise InputError(f"must be >= 1, got {min_iterations!r}", field="min_iterations")
        if isinstance(prior, dict):
            try:
                prior = OnlinePrior(**prior)
            except TypeError as e:
                raise InputError(str(e), field="prior") from None
        elif prior is not None and not isinstance(prior, OnlinePrior):
            raise InputError(f"expected OnlinePrior or dict, got {prior!r}", field="prior")
        self.prior = prior or OnlinePrior()
        if calibrated_types is None:       # the GPU types of the Arena measured table
            from .reference import load_measured
            calibrated_types = frozenset(r.gpu_type for r in load_measured())
        self.calibrated_types = frozenset(calibrated_types)
        self.make_base = make_base
        self.base_kind: str | None
        model: PerformanceModel
        if isinstance(base, str):
            if base == "online":
                raise InputError("the online model's base cannot be online", field="base")
            if make_base is None:
                raise InputError(f"base kind {base!r} needs make_base (use make_performance_model('online'))",
                                 field="base")
            self.base_kind = base
            model = make_base(base, dp_only=dp_only, **base_config)
        elif base_config:
            raise InputError(f"base options {sorted(base_config)} need a base kind, not a model", field="base")
        else:
            self.base_kind = getattr(base, "kind", None)
            model = base
        self.base: PerformanceModel = model
        self.base_config = base_config
        self.analytic = _analytic_of(model)
        self.dp_only = bool(dp_only)
        self.min_iterations = float(min_iterations)
        self.store = store if store is not None else ObservationStore()
        self.name = f"online({model.name})"
        self._twin: OnlineModel | None = None
        self._shares: dict = {}                 # (model, batch, grid) -> communication share
        self._fits: dict[str, tuple] = {}       # job -> (version, observations, K^-1 x)

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
            if self.make_base is None or self.base_kind is None:
                raise InputError("the data-parallel-only twin needs the base's kind and factory "
                                 "(build the model with make_performance_model('online'))", field="base")
            self._twin = OnlineModel(base=self.base_kind, min_iterations=self.min_iterations, prior=self.prior,
                                     dp_only=True, store=self.store, calibrated_types=self.calibrated_types,
                                     make_base=self.make_base, **self.base_config)
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
        fit = self._fit(job)
        if fit is None:
            return b
        obs, alpha = fit
        e = self.predicted_log_error(job, grid, obs, alpha)
        t = b.iteration_time_s * math.exp(e)
        n = sum(o[3] for o in obs)
        return Estimate(t, job.global_batch / t, b.peak_memory_bytes, b.plan, True, f"{self.name}/corrected",
                        b.notes + (f"online correction x{math.exp(e):.3f} from {n:g} measured iterations on "
                                   f"{len(obs)} grid(s)",))

    # -- the correction --------------------------------------------------------------------
    def comm_share(self, job: Job, grid: Grid) -> float:
        """Communication share of the base model's proxy plan on ``grid`` (0 when the base
        has no analytic composition)."""
        key = (job.model, job.global_batch, grid)
        s = self._shares.get(key)
        if s is None:
            r = None if self.analytic is None else self.analytic.plan_result(job, grid)
            s = 0.0 if r is None else min(1.0, max(0.0, sum(r.breakdown.shares()[p] for p in COMM_PARTS)))
            self._shares[key] = s
        return s

    def observations(self, job: Job) -> list[tuple[Grid, float, float, float]]:
        """(grid, observed log error of the base model, communication share, iterations)
        of every grid ``job`` was measured on that the base model estimates."""
        out = []
        for g, s in self.store.of(job.job_id).items():
            b = self.base.estimate(job, g)
            if b.feasible and math.isfinite(b.iteration_time_s) and b.iteration_time_s > 0:
                out.append((g, math.log(s.mean_s / b.iteration_time_s), self.comm_share(job, g), s.iterations))
        return out

    def covariance(self, g: Grid, s: float, h: Grid, t: float) -> float:
        """Prior covariance of the base model's log errors on grids ``g`` and ``h``
        (communication shares ``s`` and ``t``)."""
        p = self.prior
        c = p.job ** 2 + p.comm ** 2 * s * t
        if g.gpu_type == h.gpu_type:
            c += (p.type if g.gpu_type in self.calibrated_types else p.new_type) ** 2
        if g.shape == h.shape:
            c += p.shape ** 2
        if g == h:
            c += p.grid ** 2
        return c

    def _fit(self, job: Job):
        """(observations, (K + noise)^-1 x) of ``job``, kept until it is observed again."""
        v = self.store.version(job.job_id)
        f = self._fits.get(job.job_id)
        if f is None or f[0] != v:
            obs = self.observations(job)
            alpha = None
            if obs:
                K = np.array([[self.covariance(gi, si, gj, sj) for gj, _, sj, _ in obs] for gi, _, si, _ in obs])
                K += np.diag([math.log1p(self.prior.iteration_cv ** 2) / n for *_, n in obs])
                alpha = np.linalg.solve(K + 1e-12 * np.eye(len(obs)), np.array([o[1] for o in obs]))
            f = self._fits[job.job_id] = (v, obs, alpha)
        return None if not f[1] else f[1:]

    def predicted_log_error(self, job: Job, grid: Grid, obs, alpha) -> float:
        """Posterior mean of the base model's log error on ``grid`` given ``obs``."""
        s = self.comm_share(job, grid)
        return float(np.array([self.covariance(grid, s, gi, si) for gi, _, si, _ in obs]) @ alpha)
