"""The ``analytic`` performance model: the planner's proxy plan in each grid, layer
times from the roofline over catalog specs (or the profile store where the device was
profiled), pipeline composition and the memory check. Estimates are cached per (model,
global batch, grid, link load)."""
from __future__ import annotations

import math

from instances.errors import InputError
from instances.grid import Grid
from instances.jobs import Job
from instances.limits import MAX_LINK_LOAD, is_number

from .base import Estimate
from .config import EfficiencyConfig, EstimatorConfig, MemoryConfig, PlannerConfig
from .planner import Planner, PlanResult


def _estimator_config(efficiency=None, memory=None, planner=None) -> EstimatorConfig:
    def coerce(v, cls, name):
        if v is None:
            return cls()
        if isinstance(v, cls):
            return v
        if isinstance(v, dict):
            try:
                return cls(**v)
            except TypeError as e:
                raise InputError(str(e), field=name) from None
        raise InputError(f"expected {cls.__name__} or dict", field=name)
    return EstimatorConfig(coerce(efficiency, EfficiencyConfig, "efficiency"),
                           coerce(memory, MemoryConfig, "memory"), coerce(planner, PlannerConfig, "planner"))


class AnalyticModel:
    """Proxy plan + composition over roofline or profiled layer times."""
    kind = "analytic"
    name = "analytic"

    def __init__(self, *, dp_only: bool = False, efficiency=None, memory=None, planner=None,
                 profile_store=None, profile_device: str | None = None, link_load: float = 0.0):
        if not (is_number(link_load) and 0 <= link_load <= MAX_LINK_LOAD):      # (nan fails both)
            raise InputError(f"must be a fraction of the links' capacity in [0, {MAX_LINK_LOAD:g}] (other jobs' "
                             f"traffic on them), got {link_load!r}", field="link_load")
        self.cfg = _estimator_config(efficiency, memory, planner)
        self.dp_only = bool(dp_only)
        self.link_load = float(link_load)
        timer = comm = None
        self.profiled_device = None
        self.profile_store = None               # kept for the data-parallel-only twin (perf.DpOnlyTwin)
        if profile_store is not None:
            from .profile_store import ProfileStore
            store = profile_store if isinstance(profile_store, ProfileStore) else ProfileStore(profile_store)
            timer, comm = store.timers(self.cfg.efficiency, device=profile_device)
            self.profiled_device = getattr(timer, "device", None)
            self.profile_store = store
        self.planner = Planner(self.cfg, timer, comm)
        self._cache: dict = {}
        self._plans: dict = {}          # (model, batch, grid, load) -> the proxy plan's PlanResult
        if self.dp_only:
            self.name = f"{self.name}-dp"

    def plan_result(self, job: Job, grid: Grid, link_load: float | None = None) -> PlanResult | None:
        load = self.link_load if link_load is None else float(link_load)
        key = (job.model, job.global_batch, grid, load)
        if key not in self._plans:      # estimates and their communication shares read the same plan
            self._plans[key] = self.planner.proxy(job.arch, job.global_batch, grid, link_load=load,
                                                  dp_only=self.dp_only)
        return self._plans[key]

    def _source(self, grid: Grid, r: PlanResult) -> tuple[str, tuple[str, ...]]:
        bd = r.breakdown
        if bd.profiled_layers == bd.total_layers and bd.total_layers:
            return "analytic:profiled", ()
        if bd.profiled_layers:
            return "analytic:profiled+roofline-transfer", (
                f"{bd.total_layers - bd.profiled_layers} of {bd.total_layers} layers by roofline transfer",)
        return "analytic:roofline-transfer", (f"{grid.gpu_type} layer costs by roofline transfer from catalog "
                                              "specs and EfficiencyConfig",)

    def _compute(self, job: Job, grid: Grid, load: float) -> Estimate:
        r = self.plan_result(job, grid, load)
        if r is None:
            why = "pure data parallelism needs pp = 1" if self.dp_only and grid.pp > 1 else \
                "more pipeline stages than layers"
            return Estimate(math.inf, 0.0, math.inf, None, False, self.name, (why,))
        src, notes = self._source(grid, r)
        t = r.iteration_time_s
        if not r.feasible:
            notes = notes + (f"does not fit: {r.memory.peak_bytes / 2**30:.1f} GiB per rank",)
        return Estimate(t, job.global_batch / t, r.memory.peak_bytes, r.plan, r.feasible, f"{self.name}/{src}", notes)

    def estimate(self, job: Job, grid: Grid, *, link_load: float | None = None) -> Estimate:
        load = self.link_load if link_load is None else float(link_load)
        key = (job.model, job.global_batch, grid, load)
        e = self._cache.get(key)
        if e is None:
            e = self._compute(job, grid, load)
            self._cache[key] = e
        return e

    def clear_cache(self) -> None:
        self._cache.clear()
        self._plans.clear()


def analytic_of(model) -> "AnalyticModel | None":
    """The analytic model whose proxy plans (and profile store) a performance model's
    estimates follow: an ``AnalyticModel`` itself; ``learned``, ``table`` and others keep
    one as ``.analytic``; None when there is none."""
    return model if isinstance(model, AnalyticModel) else getattr(model, "analytic", None)
