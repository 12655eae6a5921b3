"""The ``online`` performance model: a base model corrected, per job, by the iteration
times measured while the job runs (non-intrusive profiling: nothing is run for it).

``observe(job, grid, iteration_time_s, iterations)`` adds ``iterations`` measured
iterations averaging ``iteration_time_s`` on ``grid`` (the engine's round loop feeds
every running job's new measurements each round; engine/core/online_feed.py). Then, for that
job (docs/estimators.md, "Online profiling", states the rule):

- on a grid it ran ``min_iterations`` or more iterations on: the observed mean;
- on any other grid: the base estimate times ``exp(e)``, ``e`` the predicted log error
  of the base model on that grid given the job's observed log errors
  ``x_i = log(observed mean_i / base estimate_i)`` — the posterior mean of a Gaussian
  prior over the log errors (kriging) whose covariance between job ``j`` on grid ``g``
  and job ``k`` on grid ``h`` is

      [j = k]·(job² + type(t)²·[same GPU type t] + shape²·[same resource shape]
               + grid²·[same grid] + comm²·s·s')
      + [same resource shape]·(shared_shape² + shared_family²·[same model family]
                               + shared_model²·[same model])

  (``s``: the communication share — tensor-parallel collectives, pipeline sends, exposed
  gradient all-reduce — of the base model's proxy plan, from the analytic composition:
  the part of the error that scales with communication), each observation with
  measurement variance ``log(1 + iteration_cv²) / iterations``. The ``shared_*`` parts
  are what every job run on a resource shape tells about that shape (cross-job
  learning): the error the base model makes there for every job, for jobs of the same
  family, and for jobs of the same model. One observed grid moves a
  neighbour by the fraction of the base model's error that neighbours share; the
  fractions (``OnlinePrior``) are fitted to how the base model's errors co-vary across
  grids of the same job (``estimators.evaluation.online_prior``) on the GPU types of the
  Arena measured table, which the base model's constants were fitted on. On any other
  type (``cpu`` ranks here, a new GPU) the base model's error is dominated by what the
  job and type share, so ``type(t)`` is ``new_type`` (large): one observed grid moves
  the type's other grids almost by the whole observed ratio.

Other jobs' runs enter in two stages (an approximation of the joint kriging, exact when
the ``shared_*`` parts are 0): first, per resource shape, the posterior mean ``mu`` and
variance ``v`` of the shared part for the job's family and model, from the last
``SHARED_WINDOW`` runs of *other* jobs that reached ``min_iterations`` there (their
observed log errors, each with its own job's parts as noise: what those jobs' runs on
other shapes say about their own parts is not used); then the job's own kriging above on
its residuals ``x_i - mu``, with ``v`` added to the covariance of two grids of the same
shape. A grid's predicted log error is ``mu`` of its shape plus the kriged residual. An
observation enters the shared stage when its run reaches ``min_iterations`` on a grid,
with the mean it had then (so estimates change only when a run is established, not
every round).

Estimates of a job without observations of its own are the base model's times the
shared correction (shared by every job of the same model and batch); ``estimate_key(job)``
changes whenever the job's own estimates may have, ``shared_key()`` whenever another
job's run was established, so callers that memoize estimates
(engine/decide/formulation/round_data.py) never serve stale ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Hashable

import numpy as np

from instances.errors import InputError
from instances.grid import Grid
from instances.jobs import Job
from instances.models import get_model

from .analytic import analytic_of
from .base import Estimate, PerformanceModel

COMM_PARTS = ("tp_comm", "p2p", "dp_exposed")     # Breakdown.shares() keys of the communication share
SHARED_WINDOW = 64      # other jobs' established runs per resource shape the shared stage uses (the latest)


@dataclass(frozen=True)
class OnlinePrior:
    """Prior covariance of the base model's log errors across jobs and grids (module
    docstring): standard deviations of the shared parts, in natural-log units. The
    defaults are ``estimators.evaluation.online_prior.fit_online_prior`` on the Arena
    measured table with the ``analytic`` base (``bench/bench_online.py --fit-prior``);
    ``new_type`` replaces ``type`` on GPU types outside ``OnlineModel.calibrated_types``
    (a stated default: log-sd 1, an error of a factor e either way is unremarkable on an
    uncalibrated device); ``iteration_cv`` is the assumed per-iteration jitter of measured
    step times. With no other job's run on a shape, the shared parts count as the job's
    own: its own-grid observations carry over exactly as with ``shape² = 0.044² + 0.147² +
    0.108² + 0.131² = 0.229²`` (the fit without other jobs gives 0.229). To turn learning
    across jobs off, set the three ``shared_*`` parts to 0 and ``shape`` to 0.229 (what
    ``fit_online_prior(cross_job=False)`` gives)."""
    job: float = 0.0
    type: float = 0.087
    new_type: float = 1.0
    shape: float = 0.044
    grid: float = 0.0
    comm: float = 0.465
    shared_shape: float = 0.147
    shared_family: float = 0.108
    shared_model: float = 0.131
    iteration_cv: float = 0.05

    def __post_init__(self):
        for f in ("job", "type", "new_type", "shape", "grid", "comm", "shared_shape", "shared_family",
                  "shared_model", "iteration_cv"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise InputError(f"must be a finite number >= 0, got {v!r}", field=f"prior.{f}")
        if self.job == self.type == self.shape == self.grid == self.comm == 0 and not self.learns_across_jobs:
            raise InputError("at least one prior part must be > 0", field="prior")

    @property
    def learns_across_jobs(self) -> bool:
        return self.shared_shape > 0 or self.shared_family > 0 or self.shared_model > 0

    def shared(self, family_a: str | np.ndarray, model_a: str | np.ndarray, family_b: str | np.ndarray,
               model_b: str | np.ndarray) -> float | np.ndarray:
        """Prior covariance of the shared part on one resource shape of two jobs (numpy
        arrays of families and models broadcast)."""
        return (self.shared_shape ** 2 + self.shared_family ** 2 * (family_a == family_b)
                + self.shared_model ** 2 * (model_a == model_b))

    def noise(self, iterations: float) -> float:
        """Variance of the log of a mean over ``iterations`` measured iterations."""
        return math.log1p(self.iteration_cv ** 2) / iterations


@dataclass
class _Seen:
    iterations: float = 0.0
    seconds: float = 0.0                          # sum of iteration times

    @property
    def mean_s(self) -> float:
        return self.seconds / self.iterations


@dataclass(frozen=True)
class Established:
    """A run that reached ``min_iterations`` measured iterations on a grid, with its mean then."""
    job: Job
    grid: Grid
    mean_s: float
    iterations: float


class ObservationStore:
    """Measured iterations per (job, grid), with a version per job that changes on every
    observation, and the runs established (``min_iterations`` reached on a grid), in
    order. Shared by an online model and its data-parallel-only twin."""

    def __init__(self, min_iterations: float = 20) -> None:
        self.min_iterations = float(min_iterations)
        self._seen: dict[str, dict[Grid, _Seen]] = {}
        self._version: dict[str, int] = {}
        self.established: list[Established] = []

    def add(self, job: Job, grid: Grid, iteration_time_s: float, iterations: float) -> None:
        if not isinstance(job, Job):
            raise InputError(f"expected a Job, got {job!r}", field="job")
        if not isinstance(grid, Grid):
            raise InputError(f"expected a Grid, got {grid!r}", field="grid")
        for name, v in (("iteration_time_s", iteration_time_s), ("iterations", iterations)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InputError(f"must be a positive finite number, got {v!r}", field=name)
        s = self._seen.setdefault(job.job_id, {}).setdefault(grid, _Seen())
        before = s.iterations
        s.iterations += float(iterations)
        s.seconds += float(iterations) * float(iteration_time_s)
        self._version[job.job_id] = self._version.get(job.job_id, 0) + 1
        if before < self.min_iterations <= s.iterations:
            self.established.append(Established(job, grid, s.mean_s, s.iterations))

    def of(self, job_id: str) -> dict[Grid, _Seen]:
        return self._seen.get(job_id, {})

    def version(self, job_id: str) -> int:
        return self._version.get(job_id, 0)


def _bounded(cache: dict, limit: int) -> dict:
    """``cache``, emptied first when it holds ``limit`` entries (a derived cache: what it
    held is recomputed when asked for again)."""
    if len(cache) >= limit:
        cache.clear()
    return cache


def _usable(e: Estimate) -> bool:
    return e.feasible and math.isfinite(e.iteration_time_s) and e.iteration_time_s > 0


class OnlineModel:
    """PerformanceModel and ``LearnsOnline``: ``base`` corrected per job by what its runs,
    and other jobs' runs on the same shapes, measured (module docstring). Its derived
    caches (per job, per grid list, per grid, per shape) are emptied when one holds ``MAX_CACHED``
    entries, so a long-running service does not grow them without bound; they are
    recomputed on demand (the observations themselves are kept)."""
    kind = "online"
    MAX_CACHED = 20_000

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
        self.analytic = analytic_of(model)
        self.dp_only = bool(dp_only)
        self.min_iterations = float(min_iterations)
        if store is not None and store.min_iterations != self.min_iterations:
            raise InputError(f"the store establishes runs at {store.min_iterations:g} iterations, the model at "
                             f"{self.min_iterations:g}", field="min_iterations")
        self.store = store if store is not None else ObservationStore(self.min_iterations)
        self.name = f"online({model.name})"
        self._twin: OnlineModel | None = None
        self._shares: dict = {}                 # (model, batch, grid) -> communication share
        self._observed_base: dict = {}          # (model, batch, grid) -> (base iteration time or None, share)
        self._fits: dict[str, _Fit] = {}        # job -> its own kriging, with its (version, shared key)
        self._grid_sets: dict = {}              # (model, batch, grids) -> _Grids
        self._grid_tuples: dict = {}            # id of a grids tuple -> (it, model, batch, _Grids)
        self._families: dict[str, str] = {}
        self._n_shared = 0                      # established runs taken into _by_shape
        self._by_shape: dict = {}               # shape -> [(job id, family, model, grid, log error, share, n)]
        self._ids_by_shape: dict = {}           # shape -> the job ids among them
        self._effects: dict = {}                # shape -> {(family, model, excluded job): (mu, v, runs)}
        self._shape_cov: dict = {}              # shape -> _ShapeRuns of its runs in _by_shape
        self._changed: list = []                # the shape of every run taken into _by_shape, in order

    def cache_sizes(self) -> dict[str, int]:
        """Entries in each derived cache now (``MAX_CACHED`` bounds each): ``shares``
        (communication share per model, batch and grid), ``observed_base`` (the base's
        time there), ``fits`` (per job), ``grid_sets`` and ``grid_tuples`` (per grid list),
        ``shape_runs`` (per shape)."""
        return {"shares": len(self._shares), "observed_base": len(self._observed_base), "fits": len(self._fits),
                "grid_sets": len(self._grid_sets), "grid_tuples": len(self._grid_tuples),
                "shape_runs": len(self._shape_cov)}

    # -- LearnsOnline ------------------------------------------------------------------
    def observe(self, job: Job, grid: Grid, iteration_time_s: float, iterations: float) -> None:
        """``iterations`` iterations of ``job`` measured on ``grid``, ``iteration_time_s`` each on average."""
        self.store.add(job, grid, iteration_time_s, iterations)

    def estimate_key(self, job: Job) -> Hashable | None:
        """None while ``job`` has no observations (its estimates are those of every job of
        its model and batch); else a key that changes with every observation of it."""
        v = self.store.version(job.job_id)
        return None if v == 0 else (job.job_id, v)

    def shared_key(self) -> Hashable | None:
        """None when no job's estimates depend on other jobs' runs; else a key that
        changes whenever another run was established (every job's estimates may have)."""
        return len(self.store.established) if self.prior.learns_across_jobs else None

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
        if not b.feasible or not math.isfinite(b.iteration_time_s):
            return b
        own = self.store.of(job.job_id).get(grid)
        if own is not None and own.iterations >= self.min_iterations:
            t = own.mean_s
            return Estimate(t, job.global_batch / t, b.peak_memory_bytes, b.plan, True,
                            f"{self.name}/observed",
                            b.notes + (f"mean of {own.iterations:g} measured iterations",))
        corr = self.predicted_log_error(job, grid)
        if corr is None:
            return b
        e, why = corr
        t = b.iteration_time_s * math.exp(e)
        return Estimate(t, job.global_batch / t, b.peak_memory_bytes, b.plan, True, f"{self.name}/corrected",
                        b.notes + (f"online correction x{math.exp(e):.3f} from {why}",))

    # -- the correction --------------------------------------------------------------------
    def comm_share(self, job: Job, grid: Grid) -> float:
        """Communication share of the base model's proxy plan on ``grid`` (0 when the base
        has no analytic composition)."""
        key = (job.model, job.global_batch, grid)
        s = self._shares.get(key)
        if s is None:
            r = None if self.analytic is None else self.analytic.plan_result(job, grid)
            s = 0.0 if r is None else min(1.0, max(0.0, sum(r.breakdown.shares()[p] for p in COMM_PARTS)))
            _bounded(self._shares, self.MAX_CACHED)[key] = s
        return s

    def family(self, model: str) -> str:
        """The model's family (``gpt``, ``moe``, ...; the model itself when it has none)."""
        f = self._families.get(model)
        if f is None:
            try:
                f = get_model(model).family
            except (InputError, KeyError, ValueError, OSError):
                f = model
            self._families[model] = f
        return f

    def observations(self, job: Job) -> list[tuple[Grid, float, float, float]]:
        """(grid, observed log error of the base model, communication share, iterations)
        of every grid ``job`` was measured on that the base model estimates."""
        out = []
        for g, s in self.store.of(job.job_id).items():
            key = (job.model, job.global_batch, g)
            base = self._observed_base.get(key)
            if base is None:
                b = self.base.estimate(job, g)
                base = _bounded(self._observed_base, self.MAX_CACHED)[key] = (
                    (b.iteration_time_s, self.comm_share(job, g)) if _usable(b) else (None, 0.0))
            if base[0] is not None:
                out.append((g, math.log(s.mean_s / base[0]), base[1], s.iterations))
        return out

    def covariances(self, grids, shares, shape_var=None) -> np.ndarray:
        """Prior covariance of one job's own parts of the base model's log errors between
        every pair of ``grids`` (communication shares ``shares``):
        ``job² + comm²·s·s' + type(t)²·[same type] + shape²·[same shape] + grid²·[same grid]``,
        plus ``shape_var[i]`` on pairs of the same shape where given."""
        p = self.prior
        s = np.asarray(shares, dtype=float)
        codes = []
        for keys in ([g.gpu_type for g in grids], [g.shape for g in grids], list(grids)):
            index: dict = {}
            c = np.array([index.setdefault(k, len(index)) for k in keys])
            codes.append(c[:, None] == c[None, :])
        same_type, same_shape, same_grid = codes
        tc = np.array([(p.type if g.gpu_type in self.calibrated_types else p.new_type) ** 2 for g in grids])
        c = p.job ** 2 + (p.comm ** 2 * s)[:, None] * s[None, :]
        c = c + np.where(same_type, tc[:, None], 0.0)
        c = c + np.where(same_shape, p.shape ** 2, 0.0)
        c = c + np.where(same_grid, p.grid ** 2, 0.0)
        return c if shape_var is None else c + np.where(same_shape, np.asarray(shape_var)[:, None], 0.0)

    def _shared_runs(self) -> dict:
        """Other jobs' established runs per resource shape (the latest ``SHARED_WINDOW``),
        taken in as they are established."""
        est = self.store.established
        while self._n_shared < len(est):
            r = est[self._n_shared]
            self._n_shared += 1
            b = self.base.estimate(r.job, r.grid)
            if not _usable(b):
                continue
            runs = self._by_shape.setdefault(r.grid.shape, [])
            runs.append((r.job.job_id, self.family(r.job.model), r.job.model, r.grid,
                         math.log(r.mean_s / b.iteration_time_s), self.comm_share(r.job, r.grid), r.iterations))
            del runs[:-SHARED_WINDOW]
            self._ids_by_shape[r.grid.shape] = {x[0] for x in runs}
            self._effects.pop(r.grid.shape, None)
            self._shape_cov.pop(r.grid.shape, None)
            self._changed.append(r.grid.shape)
        return self._by_shape

    def shared_effect(self, job: Job, shape) -> tuple[float, float, int]:
        """(mu, v, runs): posterior mean and variance of the shared part of the base
        model's log error on ``shape`` for ``job``, from the established runs of other
        jobs there (``runs`` of them)."""
        self._shared_runs()
        mine = job.job_id in self._ids_by_shape.get(shape, ())
        return self._shared_effect(self.family(job.model), job.model, shape, job.job_id if mine else None)

    def _shared_effect(self, fam: str, model: str, shape, exclude: str | None) -> tuple[float, float, int]:
        """``shared_effect`` for a job of family ``fam`` and model ``model`` from the runs
        on ``shape`` of every job but ``exclude``."""
        p = self.prior
        prior_v = float(p.shared(fam, model, fam, model))
        if prior_v == 0:
            return 0.0, 0.0, 0
        runs = self._shared_runs().get(shape, ())
        key = (fam, model, exclude)
        memo = self._effects.setdefault(shape, {})
        hit = memo.get(key)
        if hit is not None:
            return hit
        m = self._shape_runs(shape) if runs else None
        keep = None if m is None or exclude is None else m.ids != exclude      # leave the job's own runs out
        if m is None or (keep is not None and not keep.any()):
            res = (0.0, prior_v, 0)
        else:
            C, x, fams, models = ((m.cov, m.log_errors, m.families, m.models) if keep is None else
                                  (m.cov[np.ix_(keep, keep)], m.log_errors[keep], m.families[keep], m.models[keep]))
            n = len(x)
            t = np.asarray(p.shared(fam, model, fams, models), dtype=float)
            sol = np.linalg.solve(C + 1e-12 * np.eye(n), np.column_stack([x, t]))
            res = (float(t @ sol[:, 0]), max(0.0, prior_v - float(t @ sol[:, 1])), n)
        _bounded(memo, self.MAX_CACHED)[key] = res
        return res

    def _shape_runs(self, shape) -> "_ShapeRuns":
        """The runs on ``shape`` as arrays, with the prior covariance of their log errors
        (the shared parts, plus a run's own job's parts between runs of the same job, plus
        measurement noise): built once per shape until a run is taken in there; a query
        that leaves one job out takes the sub-matrix of the others, element for element
        the matrix built from them alone."""
        m = self._shape_cov.get(shape)
        if m is None:
            p, runs = self.prior, self._by_shape[shape]
            ids, fams, models = (np.array([r[c] for r in runs]) for c in (0, 1, 2))
            C = np.asarray(p.shared(fams[:, None], models[:, None], fams[None, :], models[None, :]), dtype=float)
            C = C + np.where(ids[:, None] == ids[None, :], self.covariances([r[3] for r in runs],
                                                                            [r[5] for r in runs]), 0.0)
            C[np.diag_indices(len(runs))] += [p.noise(r[6]) for r in runs]
            m = _bounded(self._shape_cov, self.MAX_CACHED)[shape] = _ShapeRuns(
                ids, fams, models, np.array([r[4] for r in runs]), C)
        return m

    def prepare(self, jobs) -> None:
        """``EstimatesInBulk``: fit, before their estimates are asked for, the own kriging
        of every job of ``jobs`` that has observations and a stale fit, with one
        ``np.linalg.solve`` per system size over all of them (a stack of systems, each
        solved by the same LAPACK call as alone: the same solution, bit for bit)."""
        self._fits_of([j for j in jobs if self.store.of(j.job_id)])

    def _fit(self, job: Job) -> "_Fit":
        """``job``'s own kriging on its residuals ``x - mu`` (``mu`` the observed shapes'
        shared effects), decomposed by what the covariance tests; kept until the job is
        observed again or another run established changes the shared effect of one of its
        observed shapes."""
        last = self._fits.get(job.job_id)
        if last is not None and last.key == (self.store.version(job.job_id), self.shared_key()):
            return last
        return self._fits_of([job])[0]

    def _fits_of(self, jobs) -> list["_Fit"]:
        """``_fit`` of every job of ``jobs`` (each once): the systems of the stale ones
        solved together, by size."""
        self._shared_runs()
        taken = len(self._changed)
        shared = self.shared_key()
        out: list[_Fit] = []
        due: dict[int, list] = {}           # system size -> [(fit, job id, prior covariance, noise, residuals)]
        for job in jobs:
            f, system = self._fit_begin(job, (self.store.version(job.job_id), shared), taken)
            out.append(f)
            if system is not None:
                due.setdefault(len(system[2]), []).append((f, job.job_id) + system)
        for n, group in due.items():
            # K + 1e-12·I with K = cov + diag(noise), element for element as for one system
            K = np.array([g[2] for g in group])
            d = np.arange(n)
            K[:, d, d] += np.array([g[3] for g in group])
            K += 1e-12 * np.eye(n)
            alpha = np.linalg.solve(K, np.array([g[4] for g in group])[:, :, None])[:, :, 0]
            for (f, job_id, *_), a in zip(group, alpha):
                self._fit_end(f, a)
                _bounded(self._fits, self.MAX_CACHED)[job_id] = f
        return out

    def _fit_begin(self, job: Job, key: tuple, taken: int):
        """(the fit of ``job`` at ``key``, None) when nothing is left to solve; else (a new
        fit, (its prior covariance, its observations' noise, its residuals)) for
        ``_fit_end`` to finish from the solution."""
        last = self._fits.get(job.job_id)
        if last is not None and last.key == key:
            return last, None
        kept = last if last is not None and last.key[0] == key[0] else None     # no new observation of the job since
        obs = kept.obs if kept is not None else self.observations(job)
        # an observed shape's shared effect is the last fit's while no run was taken in there since
        moved = set(self._changed[last.taken:]) if last is not None else set()
        effects = {}
        for g, *_ in obs:
            s = g.shape
            if s not in effects:
                effects[s] = (last.effects[s] if last is not None and s in last.effects and s not in moved
                              else self.shared_effect(job, s))
        if kept is not None and kept.effects == effects:
            kept.key, kept.taken = key, taken   # the runs established since changed none of its shapes' effects
            return kept, None
        f = _Fit(key, effects, obs, taken)
        if not obs:
            _bounded(self._fits, self.MAX_CACHED)[job.job_id] = f
            return f, None
        # the prior part of the covariance: the last fit's while the grids, shares and shape effects stay
        f.cov_key = (tuple(o[0] for o in obs), tuple(o[2] for o in obs),
                     tuple(effects[o[0].shape][1] for o in obs))
        f.cov = (last.cov if last is not None and last.cov is not None and last.cov_key == f.cov_key
                 else self.covariances(*f.cov_key))
        p = self.prior
        return f, (f.cov, [p.noise(n) for *_, n in obs], [x - effects[g.shape][0] for g, x, _, _ in obs])

    def _fit_end(self, f: "_Fit", alpha: np.ndarray) -> None:
        """``f``'s terms from the solution ``alpha`` of its system."""
        p, obs, effects = self.prior, f.obs, f.effects
        # sum_i covariance(grid, s, g_i, s_i) alpha_i, term by term (``covariances``' terms)
        f.const = p.job ** 2 * float(alpha.sum())
        f.comm = p.comm ** 2 * float(sum(a * si for a, (_, _, si, _) in zip(alpha, obs)))
        for a, (g, *_) in zip(alpha, obs):
            t = g.gpu_type
            tc = p.type if t in self.calibrated_types else p.new_type
            f.by_type[t] = f.by_type.get(t, 0.0) + tc ** 2 * float(a)
            f.by_shape[g.shape] = f.by_shape.get(g.shape, 0.0) + (p.shape ** 2 + effects[g.shape][1]) * float(a)
            if p.grid:
                f.by_grid[g] = f.by_grid.get(g, 0.0) + p.grid ** 2 * float(a)
        f.own = f"{sum(o[3] for o in obs):g} measured iterations on {len(obs)} grid(s)"

    def predicted_log_error(self, job: Job, grid: Grid) -> tuple[float, str] | None:
        """Posterior mean of the base model's log error of ``job`` on ``grid`` and what it
        comes from; None when nothing measured bears on it. Grid by grid, the reference
        that ``throughputs`` computes in bulk (tests compare them)."""
        f = self._fit(job) if self.store.of(job.job_id) else None
        own = f.own if f is not None else None
        mu, _, n_runs = self.shared_effect(job, grid.shape)
        if own is None and n_runs == 0:
            return None
        e = mu
        parts: list[str] = []
        if f is not None and own is not None:
            e += (f.const + f.comm * self.comm_share(job, grid) + f.by_type.get(grid.gpu_type, 0.0)
                  + f.by_shape.get(grid.shape, 0.0) + f.by_grid.get(grid, 0.0))
            parts.append(own)
        if n_runs:
            parts.append(f"{n_runs} other run(s) on this shape")
        return e, " and ".join(parts)

    def throughputs(self, job: Job, grids) -> tuple[list[float], list]:
        """``EstimatesInBulk``: per grid, the throughput ``estimate`` gives (0 where the base
        is not usable) and the base's proxy plan, with the correction as array operations."""
        g = self._grids(job, grids)
        e = self._log_errors(job, g)
        with np.errstate(invalid="ignore"):
            t = g.time if e is None else g.time * np.exp(e)
            thr = np.where(g.usable, job.global_batch / t, 0.0)
        for grid, seen in self.store.of(job.job_id).items():
            i = g.index.get(grid)
            if i is not None and g.usable[i] and seen.iterations >= self.min_iterations:
                thr[i] = job.global_batch / seen.mean_s
        return thr.tolist(), g.plans

    def _grids(self, job: Job, grids) -> "_Grids":
        """What the correction reads of ``grids`` that depends on the job only through its
        model and batch (kept per such key and grid list)."""
        if type(grids) is tuple:        # immutable, so known by identity: cheaper than hashing its grids
            hit = self._grid_tuples.get(id(grids))
            if hit is not None and hit[0] is grids and hit[1] == job.model and hit[2] == job.global_batch:
                return hit[3]
        key = (job.model, job.global_batch, tuple(grids))
        g = self._grid_sets.get(key)
        if g is None:
            base = [self.base.estimate(job, x) for x in key[2]]
            usable = np.array([_usable(b) for b in base], dtype=bool)
            shapes: dict = {}
            types: dict = {}
            g = _bounded(self._grid_sets, self.MAX_CACHED)[key] = _Grids(
                {x: i for i, x in enumerate(key[2])}, usable,
                np.array([b.iteration_time_s if u else np.nan for b, u in zip(base, usable)]),
                np.array([self.comm_share(job, x) if u else 0.0 for x, u in zip(key[2], usable)]),
                np.array([types.setdefault(x.gpu_type, len(types)) for x in key[2]], dtype=np.int64), types,
                np.array([shapes.setdefault(x.shape, len(shapes)) for x in key[2]], dtype=np.int64), shapes,
                [b.plan for b in base])
        if type(grids) is tuple:        # the entry holds the tuple: its id is not reused while it is kept
            _bounded(self._grid_tuples, self.MAX_CACHED)[id(grids)] = (grids, job.model, job.global_batch, g)
        return g

    def _log_errors(self, job: Job, g: "_Grids") -> np.ndarray | None:
        """Predicted log error of the base model per grid of ``g`` (0 where nothing bears
        on it); None when nothing measured bears on any: the shared effect of the grid's
        shape plus the job's own kriged residual (``_Fit``)."""
        f = self._fit(job) if self.store.of(job.job_id) else None
        fam = self.family(job.model)
        self._shared_runs()
        n = len(self._changed)
        hit = g.shared.get((fam, job.model))            # every other job's runs, per shape of g
        if hit is None:
            eff = [self._shared_effect(fam, job.model, shape, None) for shape in g.shapes]
            hit = g.shared[(fam, job.model)] = (n, np.array([x[0] for x in eff]), np.array([x[2] for x in eff]))
        elif hit[0] != n:                               # only the shapes with new runs since
            mu, runs = hit[1].copy(), hit[2].copy()
            for shape in set(self._changed[hit[0]:]):
                i = g.shapes.get(shape)
                if i is not None:
                    mu[i], _, runs[i] = self._shared_effect(fam, job.model, shape, None)
            hit = g.shared[(fam, job.model)] = (n, mu, runs)
        _, mu, runs = hit
        if f is not None and f.effects:         # the job's observed shapes, without its own runs
            mu, runs = mu.copy(), runs.copy()
            for shape, (m, _, k) in f.effects.items():
                i = g.shapes.get(shape)
                if i is not None:
                    mu[i], runs[i] = m, k
        if (f is None or f.own is None) and not runs.any():
            return None
        e = mu[g.shape_of]
        if f is not None and f.own is not None:
            # the fit's term per GPU type, shape and grid, spread over g's grids
            of_type, of_shape = np.zeros(len(g.types)), np.zeros(len(g.shapes))
            for t, c in f.by_type.items():
                i = g.types.get(t)
                if i is not None:
                    of_type[i] = c
            for shape, c in f.by_shape.items():
                i = g.shapes.get(shape)
                if i is not None:
                    of_shape[i] = c
            own = f.const + f.comm * g.share + of_type[g.type_of] + of_shape[g.shape_of]
            if f.by_grid:       # (0 everywhere else: adding it would change no exp(e))
                by_grid = np.zeros(len(g.index))
                for grid, c in f.by_grid.items():
                    i = g.index.get(grid)
                    if i is not None:
                        by_grid[i] = c
                own = own + by_grid
            e = e + own
        return e


@dataclass(frozen=True, eq=False)
class _ShapeRuns:
    """The shared stage's runs on one resource shape (``OnlineModel._shape_runs``); a query
    for a job with runs there leaves them out."""
    ids: np.ndarray                 # job id per run
    families: np.ndarray
    models: np.ndarray
    log_errors: np.ndarray          # observed log error of the base model
    cov: np.ndarray                 # prior covariance between the runs, noise on the diagonal


@dataclass(eq=False)
class _Grids:
    """A grid list of one model and batch, as the correction's arrays."""
    index: dict                     # grid -> position
    usable: np.ndarray              # the base estimate is feasible with a finite positive time
    time: np.ndarray                # the base iteration time (nan where not usable)
    share: np.ndarray               # communication share (0 where not usable)
    type_of: np.ndarray             # position of the grid's GPU type in ``types``
    types: dict                     # GPU type -> position
    shape_of: np.ndarray            # position of the grid's shape in ``shapes``
    shapes: dict                    # shape -> position
    plans: list                     # the base estimates' proxy plans
    shared: dict = field(default_factory=dict)   # (family, model) -> (runs taken in, mu, runs) per shape


@dataclass(eq=False)
class _Fit:
    """One job's own kriging: ``sum_i covariance(grid, s, g_i, s_i) alpha_i`` for a grid
    on shape ``shape`` of GPU type ``t`` is ``const + comm·s + by_type[t] + by_shape[shape]
    + by_grid[grid]`` (missing keys 0); ``own`` is None when no observation is usable."""
    key: tuple
    effects: dict                   # shape -> shared_effect(job, shape)
    obs: list                       # OnlineModel.observations(job) at the key's version
    taken: int                      # len(OnlineModel._changed) when the effects were last checked
    cov_key: tuple = ()             # (grids, shares, shape variances) of ``cov``
    cov: np.ndarray | None = None   # the prior covariance of the observed grids, without measurement noise
    const: float = 0.0
    comm: float = 0.0
    by_type: dict = field(default_factory=dict)
    by_shape: dict = field(default_factory=dict)
    by_grid: dict = field(default_factory=dict)
    own: str | None = None
