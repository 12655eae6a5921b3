"""Typed value objects that flow through a round: the context a policy reads and the
decisions it returns."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from estimators.base import PerformanceModel, Plan
from instances.cluster import ClusterSpec
from instances.grid import Grid
from instances.jobs import Job

from .allocation import Allocation, GpuId
from .quick_init import quick_init

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
class Decisions:
    """Which grid each job should run on this round; jobs absent from ``grids`` wait.

    ``placements`` optionally pins concrete GPUs (policies that place for themselves);
    otherwise the engine's placement maps grids to GPUs. ``plans`` optionally carries
    the chosen plan per job; ``info`` is free-form solver/policy statistics.
    """
    grids: Mapping[str, Grid]
    placements: Mapping[str, tuple[GpuId, ...]] = field(default_factory=dict)
    plans: Mapping[str, Plan] = field(default_factory=dict)
    info: Mapping[str, Any] = field(default_factory=dict)
