"""The performance-model registry, ``make_performance_model``, the ``table`` kind and
the data-parallel-only twin used by the baselines.

Kinds (registry by name):
- ``analytic``: proxy plan from the planner; layer times from the roofline over catalog
  specs (or the profile store where the device was profiled); composition; memory check.
- ``learned``: the analytic estimate x the learned correction (estimators/learned.py);
  ``learned-choice``: the same with the correction chosen by cross-validated grid choice;
  ``learned-level``: the analytic estimate x one learned factor per model family and GPU
  type (the ``type_level`` correction): the shapes of one GPU type rank exactly as with
  ``analytic``, the level between GPU types is corrected.
- ``online``: a base kind (``base=``; default ``learned`` when a learned artifact is
  given or the default one exists, else ``analytic``) corrected per job by its runs'
  measured iteration times (estimators/online.py).
- ``table``: the Arena measured table (best plan the authors' search found) for exact
  (model, batch, GPU type, nodes, GPUs per node) rows; other grids fall back to
  ``fallback`` (default ``analytic``) and say so in ``source``. The table has no plan or
  memory column: those come from the analytic proxy plan.

``dp_only=True`` restricts every plan to pure data parallelism (pp = 1, tp = 1) with the
data-parallel memory check; the engine's baselines decide with it.

Estimates are cached per (model, global batch, grid, link load): a scheduling round
re-asks the same few hundred (model, batch) x grid pairs.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable

from instances.errors import InputError
from instances.grid import Grid
from instances.jobs import Job
from instances.registry import Registry

from .analytic import AnalyticModel, analytic_of
from .base import Estimate, PerformanceModel

KINDS: Registry[Callable[..., PerformanceModel]] = Registry("performance model kind", field="kind")
register_kind = KINDS.register
kind_names = KINDS.names


def make_performance_model(kind: str, **config: Any) -> PerformanceModel:
    """Build a performance model by kind name (``analytic``, ``learned``, ``table``, ``online``)."""
    return KINDS.get(kind)(**config)


def learned_artifact_path() -> Path:
    """Where the default learned model is kept: ``$ARENA_LEARNED_ARTIFACT``, else
    ``~/.cache/arena/learned.joblib`` (written by ``arena estimate fit``)."""
    env = os.environ.get("ARENA_LEARNED_ARTIFACT")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "arena" / "learned.joblib"


LEARNED_ARTIFACT_RUNTIME = "default"      # the runtime ``arena estimate fit`` fits the artifact for


def _saved_artifact(kind: str) -> Path | None:
    """The learned artifact on disk when ``kind`` is ``learned`` (None otherwise, or when
    there is none)."""
    path = learned_artifact_path()
    return path if kind == "learned" and path.is_file() else None


def passed_over_artifact(kind: str | None, runtime: str) -> Path | None:
    """The learned artifact ``make_default_model(kind, runtime=runtime)`` leaves unused
    because it was fitted for another runtime (None: it is used, or there is none)."""
    artifact = _saved_artifact(kind or default_kind())
    return artifact if runtime != LEARNED_ARTIFACT_RUNTIME else None


def default_kind() -> str:
    """What policies decide with unless told otherwise: estimates, never the measured
    table the simulator's oracle uses as truth. The analytic model: it picks grids better
    than the learned correction in every held-out regime (grid-choice regret,
    docs/estimators.md), though the learned one has the lower error; ``--perf learned``
    (its artifact written once by ``arena estimate fit``) and ``learned-choice`` stay
    available."""
    return "analytic"


def open_profile_store(path, field: str = "profile_store"):
    """The ``ProfileStore`` at ``path`` (or ``path`` itself when it is one), checked before
    any work: a missing or empty store is an error naming it, not a silent fall-back to
    the catalog roofline."""
    import stat

    from instances.paths import stat_path

    from .profile_store import ProfileStore
    store = path if isinstance(path, ProfileStore) else ProfileStore(path)
    st = stat_path(store.root, field)           # (a name too long, a link loop: named, not an OSError)
    if st is None or not stat.S_ISDIR(st.st_mode) or not store.devices():
        raise InputError(f"{store.root}: no profiled layers here (fill the store with `arena profile --model M "
                         f"--store {store.root}`)", field=field)
    return store


RUNTIMES = ("default", "arena")


def make_default_model(kind: str | None = None, profile_store=None, runtime: str = "default") -> PerformanceModel:
    """``kind`` (default ``default_kind()``); ``learned`` loads the default artifact when
    it exists rather than fitting afresh. ``profile_store`` (a directory ``arena profile``
    filled, or a ``ProfileStore``): layer and collective times of the profiled device come
    from it instead of the catalog roofline (every kind's analytic part; checked here:
    a missing or empty store is an error, not a silent fall-back to the catalog).
    ``runtime`` (``RUNTIMES``): what the estimates assume the jobs' training runtime does —
    ``default``, the estimator defaults (the project's launcher), or ``arena``, the Arena
    artifact's (``config.arena_runtime()``: rematerialisation, a sharded optimizer; the
    runtime the Arena table was measured under and the efficiency constants fitted
    under). The model keeps it as ``.runtime``."""
    kind = kind or default_kind()
    if runtime not in RUNTIMES:
        raise InputError(f"unknown runtime {runtime!r}; known: {', '.join(RUNTIMES)}", field="runtime")
    config: dict[str, Any] = {}
    if profile_store is not None:
        config["profile_store"] = open_profile_store(profile_store)
    if runtime == "arena":
        from .config import arena_runtime
        cfg = arena_runtime()
        config.update(efficiency=cfg.efficiency, memory=cfg.memory, planner=cfg.planner)
    artifact = _saved_artifact(kind)
    if artifact is not None and runtime == LEARNED_ARTIFACT_RUNTIME:
        model = make_performance_model("learned", artifact=artifact, **config)
    else:                          # (the artifact's corrections are relative to the default runtime)
        model = make_performance_model(kind, **config)
    model.runtime = runtime        # type: ignore[attr-defined]
    return model


class DpOnlyTwin:
    """The data-parallel-only twin of a performance model: a model of the same registered
    ``kind``, otherwise that kind's defaults, with ``dp_only=True`` (what the baselines
    decide with, as the published comparisons did). A model without a registered kind (or
    None) gets the ``table`` kind; the twin takes the model's runtime configuration
    (efficiency, memory and planner settings: ``make_default_model``'s ``runtime``) and
    its profile store, if it reads one; a model with its own
    ``dp_only_twin()`` (``online``: the twin shares its observations) gives it. The twin of the last model asked
    for is kept, so a policy builds it once per run."""

    def __init__(self) -> None:
        self._of: object = None
        self._twin: PerformanceModel | None = None

    def __call__(self, perf: PerformanceModel | None) -> PerformanceModel:
        if self._twin is None or self._of is not perf:
            kind = getattr(perf, "kind", None)
            own = getattr(perf, "dp_only_twin", None)
            base = analytic_of(perf)
            config: dict[str, Any] = {}
            if base is not None:                # the same profile and runtime as the policies'
                config.update(efficiency=base.cfg.efficiency, memory=base.cfg.memory, planner=base.cfg.planner)
                if base.profile_store is not None:
                    config["profile_store"] = base.profile_store
            self._of, self._twin = perf, own() if own is not None else make_performance_model(
                kind if kind in KINDS else "table", dp_only=True, **config)
        return self._twin


register_kind("analytic")(AnalyticModel)


class TableModel:
    """Measured Arena iteration times for exact rows; ``fallback`` for the others."""
    kind = "table"
    name = "table"

    def __init__(self, *, dp_only: bool = False, path=None, fallback: str | None = "analytic",
                 dp_memory_path=None, **analytic_config):
        from .reference import load_dp_memory, load_measured
        self.dp_only = bool(dp_only)
        self._rows = {(r.model, r.global_batch, r.gpu_type, r.num_nodes, r.gpus_per_node): r.iter_time_s
                      for r in load_measured(path)}
        self._dp_mem = {}
        if self.dp_only:
            self._dp_mem = {(r.model, r.global_batch, r.num_gpus): r.memory_bytes
                            for r in load_dp_memory(dp_memory_path)}
        if fallback not in (None, "analytic", "learned"):
            raise InputError(f"fallback must be analytic, learned or None, got {fallback!r}", field="fallback")
        self.fallback_kind = fallback
        self.analytic = AnalyticModel(dp_only=dp_only, **analytic_config)
        self.fallback = None if fallback is None else (
            self.analytic if fallback == "analytic" else make_performance_model("learned", dp_only=dp_only,
                                                                                **analytic_config))
        self._cache: dict = {}
        if self.dp_only:
            self.name = "table-dp"

    def lookup(self, job: Job, grid: Grid) -> float | None:
        s = grid.shape
        return self._rows.get((job.model, job.global_batch, s.gpu_type, s.num_nodes, s.gpus_per_node))

    def estimate(self, job: Job, grid: Grid) -> Estimate:
        key = (job.model, job.global_batch, grid)
        e = self._cache.get(key)
        if e is None:
            e = self._compute(job, grid)
            self._cache[key] = e
        return e

    def _compute(self, job: Job, grid: Grid) -> Estimate:
        s = grid.shape
        key = (job.model, job.global_batch, s.gpu_type, s.num_nodes, s.gpus_per_node)
        plan_est = self.analytic.estimate(job, grid)
        if key in self._rows:
            t = self._rows[key]
            if t is None:
                return Estimate(math.inf, 0.0, plan_est.peak_memory_bytes, plan_est.plan, False,
                                f"{self.name}/measured-oom", ("the measured table marks this row out of memory",))
            notes = ["iteration time measured with the authors' best plan; plan and memory from the analytic "
                     "proxy"]
            feasible = True
            if self.dp_only:
                mem = self._dp_mem.get((job.model, job.global_batch, grid.num_gpus), "missing")
                if grid.pp > 1:
                    feasible = False
                    notes.append("pure data parallelism needs pp = 1")
                elif mem is None:
                    feasible = False
                    notes.append("Arena's DP memory table marks this out of memory")
                elif mem == "missing":
                    feasible = plan_est.feasible
                    notes.append("no DP memory row: analytic DP memory check")
            return Estimate(t, job.global_batch / t, plan_est.peak_memory_bytes, plan_est.plan, feasible,
                            f"{self.name}/measured", tuple(notes))
        if self.fallback is None:
            return Estimate(math.inf, 0.0, plan_est.peak_memory_bytes, plan_est.plan, False,
                            f"{self.name}/missing", ("no measured row and no fallback",))
        e = self.fallback.estimate(job, grid)
        return Estimate(e.iteration_time_s, e.throughput, e.peak_memory_bytes, e.plan, e.feasible,
                        f"{self.name}/fallback:{e.source}", e.notes + ("no measured row",))


register_kind("table")(TableModel)


@register_kind("learned")
def _make_learned(**config) -> PerformanceModel:
    from .learned import LearnedModel
    return LearnedModel(**config)


@register_kind("online")
def _make_online(*, base: Any = "auto", **config) -> PerformanceModel:
    """``base="auto"``: ``learned`` when a learned artifact is given (``artifact=``) or the
    default one exists (``learned_artifact_path``), else ``analytic``."""
    from .online import OnlineModel
    if base == "auto":
        if config.get("artifact") is not None:
            base = "learned"
        elif learned_artifact_path().is_file():
            base, config = "learned", {**config, "artifact": learned_artifact_path()}
        else:
            base = "analytic"
    return OnlineModel(base=base, make_base=make_performance_model, **config)


@register_kind("learned-choice")
def _make_learned_choice(**config) -> PerformanceModel:
    """``learned.LearnedChoiceModel``: the correction chosen by cross-validated grid choice."""
    from .learned import LearnedChoiceModel
    return LearnedChoiceModel(**config)


@register_kind("learned-level")
def _make_learned_level(**config) -> PerformanceModel:
    """``learned.LearnedLevelModel``: one learned factor per (model family, GPU type)."""
    from .learned import LearnedLevelModel
    return LearnedLevelModel(**config)
