"""The estimator seam: plans, estimates and the ``PerformanceModel`` interface."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Protocol, Sequence, cast, runtime_checkable

from instances.grid import Grid
from instances.jobs import Job
from instances.plan import Plan


@dataclass(frozen=True)
class Estimate:
    iteration_time_s: float
    throughput: float                 # samples per second
    peak_memory_bytes: float          # per rank, the largest over ranks
    plan: Plan | None                 # proxy plan
    feasible: bool = True             # False: does not fit in memory (or no plan exists)
    source: str = ""                  # which estimator, and e.g. "roofline-transfer" notes
    notes: tuple[str, ...] = field(default=())


@runtime_checkable
class PerformanceModel(Protocol):
    name: str

    def estimate(self, job: Job, grid: Grid) -> Estimate:
        """Iteration time, throughput, peak memory and proxy plan of ``job`` on ``grid``."""
        ...


@runtime_checkable
class EstimatesInBulk(Protocol):
    """A performance model that estimates one job on many grids at once faster than
    grid by grid (the online model: its corrections are array operations)."""

    def throughputs(self, job: Job, grids: Sequence[Grid]) -> tuple[list[float], list[Plan | None]]:
        """Per grid: the throughput ``estimate(job, grid)`` gives (0 where it is
        infeasible) and its proxy plan."""
        ...

    def prepare(self, jobs: Sequence[Job]) -> None:
        """Told the jobs whose ``throughputs`` are about to be asked for: compute what
        their estimates need in one go where that is cheaper (the estimates are the same
        with or without it)."""
        ...


def throughputs(perf: PerformanceModel, job: Job, grids: Sequence[Grid],
                memo: dict | None = None, bulk: bool | None = None) -> tuple[list[float], list[Plan | None]]:
    """Per grid: ``perf``'s estimated throughput of ``job`` (0 where infeasible) and proxy
    plan. ``memo``, keyed by (model, global batch, grid), keeps estimates that depend on
    the job only through those (unused by a model that estimates in bulk). ``bulk``:
    whether ``perf`` is ``EstimatesInBulk``, for callers that ask job after job (the
    protocol check costs more than a memo hit); None checks it here."""
    if isinstance(perf, EstimatesInBulk) if bulk is None else bulk:
        return cast(EstimatesInBulk, perf).throughputs(job, grids)
    thr: list[float] = []
    plans: list[Plan | None] = []
    for grid in grids:
        key = (job.model, job.global_batch, grid)
        e = memo.get(key) if memo is not None else None
        if e is None:
            e = perf.estimate(job, grid)
            if memo is not None:
                memo[key] = e
        thr.append(float(e.throughput) if e.feasible else 0.0)
        plans.append(e.plan)
    return thr, plans


@runtime_checkable
class LearnsOnline(Protocol):
    """A performance model that learns from running jobs (estimators/online.py)."""

    def observe(self, job: Job, grid: Grid, iteration_time_s: float, iterations: float) -> None:
        """``iterations`` iterations of ``job`` measured on ``grid``, ``iteration_time_s`` each on average."""
        ...

    def estimate_key(self, job: Job) -> Hashable | None:
        """None while ``job``'s estimates are those of every job of its model and batch;
        else a key that changes whenever its estimates may have (for callers' memos)."""
        ...

    def shared_key(self) -> Hashable | None:
        """None while no job's estimates depend on other jobs' runs; else a key that
        changes whenever every job's estimates may have (for callers' memos)."""
        ...
