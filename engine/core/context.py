"""Typed value objects that flow through a round: the context a policy reads and the
decisions it returns."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Protocol

from estimators.base import PerformanceModel
from instances.allocation import Allocation, GpuId
from instances.cluster import ClusterSpec
from instances.grid import Grid
from instances.jobs import Job
from instances.plan import JobPlan
from instances.quick_init import quick_init

if TYPE_CHECKING:
    from .reconfig import ReconfigCostModel


@quick_init
@dataclass(frozen=True)
class ChangeHistory:
    """A job's last change of allocation (start, resume or move), what the stability rule
    (engine/decide/stability.py) reads."""
    changed_at_s: float                 # when it took its current allocation
    iterations_since: float             # progress made on it since
    rate_before: float                  # iterations/s measured before the change (0: it was queued)
    recent_s: tuple[float, ...] = ()    # times of its moves and preemptions (first starts excluded)
    total: int = 0                      # its moves and preemptions over its whole life


@quick_init
@dataclass(frozen=True)
class JobView:
    """A job as a policy sees it at a round."""
    job: Job
    remaining_iterations: float
    current: Allocation | None          # what it holds now (None: queued)
    attained_gpu_s: float = 0.0         # GPU-seconds received so far
    queued_s: float = 0.0               # time spent waiting so far
    reconfigurations: int = 0
    measured_iteration_time_s: float | None = None   # from telemetry, when running
    # Shapes on which the engine has seen this job fail to run (e.g. out of memory): the
    # truth reported back, as a live launch that crashes would be. Optional extension.
    known_infeasible_shapes: frozenset = frozenset()
    last_change: ChangeHistory | None = None     # running jobs: their last change of allocation

    @property
    def job_id(self) -> str:
        return self.job.job_id


@dataclass(frozen=True)
class RoundContext:
    now_s: float
    round_index: int
    round_interval_s: float
    cluster: ClusterSpec
    jobs: tuple[JobView, ...]           # every active (arrived, unfinished) job
    perf: PerformanceModel | None       # what policies decide with (None: a policy that needs none)
    reconfig: ReconfigCostModel | None  # prices moves (None: moves are free)
    seed: int = 0
    finished_jobs: int = 0              # jobs finished so far
    changes_total: int = 0              # moves and preemptions of every job so far, finished ones included
    unavailable_nodes: frozenset[int] = frozenset()   # drained or down: no job may be placed there
    # queued jobs left out of ``jobs``: beyond the policy's ``max_queued`` (the round loop
    # builds views only for the queued jobs a policy that says so will consider)
    queued_left_out: int = 0

    def job(self, job_id: str) -> JobView:
        for j in self.jobs:
            if j.job_id == job_id:
                return j
        raise KeyError(job_id)


@dataclass(frozen=True)
class DecisionStats:
    """What a policy reports of one decision; a field it has no value for keeps its default.
    The live service records ``status``, ``objective``, ``gap`` and ``solve_wall_s`` with
    each round."""
    jobs: int = 0                         # jobs the decision was over (after the queue window)
    queued_left_out: int = 0              # queued jobs beyond the policy's ``max_queued`` window
    frozen: int = 0                       # running jobs the stability rule kept on their grid
    move_allowance: int | None = None     # running jobs the round's budget let move (None: no budget)
    placement_repairs: int = 0            # chosen grids placement could not map and replaced by a fallback
    placement_dropped: tuple[str, ...] = ()   # chosen jobs placement left waiting (ids)
    placement_refines: int = 0            # times the policy decided again without the columns placement could not map
    columns_cut: int = 0                  # the columns those new decisions went without
    placement_fallbacks: Mapping[str, str] = field(default_factory=dict)   # job -> the grid first chosen, for
                                          # the jobs whose grid placement replaced by a fallback
    decide_time_s: float = 0.0
    # an optimizing policy's model and its solve (the solver backend's ``Solution``)
    backend: str = ""
    status: str = ""                      # the solution's status ("" without a solver)
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None
    message: str = ""
    solver_build_time_s: float | None = None    # the backend's own figures
    solver_solve_time_s: float | None = None
    solver_extra: Mapping[str, Any] = field(default_factory=dict)   # backend-specific counters
    search: str = ""                      # "full" or "incremental"
    columns: int = 0
    rows: int = 0
    unschedulable: tuple[str, ...] = ()
    estimate_time_s: float | None = None
    model_build_time_s: float | None = None
    solve_wall_s: float | None = None     # the solve as the policy timed it
    # a deadline policy (elasticflow)
    admitted: int = 0                     # jobs its rule admitted (before placement: see placement_dropped)
    best_effort: int = 0
    held_by_budget: int = 0


class Fallbacks(Protocol):
    """A policy's ranked alternatives for the round's placement (``Decisions.fallbacks``):
    what a job should run on instead when its chosen grid cannot be mapped to GPUs."""

    def smaller(self, job_id: str, than: Grid) -> tuple[Grid, JobPlan | None] | None:
        """The job's best alternative with fewer GPUs than ``than`` (None: it waits)."""
        ...


class Refine(Protocol):
    """A policy's way to decide the round again (``Decisions.refine``) when placement
    cannot map some of its chosen grids: the same round, without those (job, grid)
    columns — and without every column an earlier refinement of this decision went
    without —, so that the new optimum is one placement can carry out."""

    def without(self, failed: Mapping[str, Grid]) -> Decisions:
        """The round decided again without the ``failed`` columns (and earlier ones)."""
        ...


@dataclass(frozen=True)
class Decisions:
    """Which grid each job should run on this round; jobs absent from ``grids`` wait.

    The round's placement (engine/core/round_placement.py) maps grids to GPUs. A policy
    that decides by fitting jobs itself pins the GPUs it fitted (``placements``); an
    optimizing policy instead hands its ranked smaller alternatives (``fallbacks``), which
    the placement takes for a grid that does not fit. ``plans`` optionally carries the
    chosen plan per job; ``stats`` what the policy reports of the decision (the
    placement fills ``placement_repairs`` and ``placement_dropped`` when it takes
    fallbacks). An optimizing policy also hands ``refine``: the placement first asks it to
    decide again without the columns it could not map (a few times), and takes the
    fallbacks only for what still does not fit.
    """
    grids: Mapping[str, Grid]
    placements: Mapping[str, tuple[GpuId, ...]] = field(default_factory=dict)
    plans: Mapping[str, JobPlan] = field(default_factory=dict)
    stats: DecisionStats = field(default_factory=DecisionStats)
    fallbacks: Fallbacks | None = None
    refine: Refine | None = None
