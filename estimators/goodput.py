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
may grow) is the policies' business (engine/policies/sia_goodput.py). A named
simplification, measured in docs/results/2026-12-04-sia-fidelity.md.

``estimate(job, grid)`` (the ``PerformanceModel`` seam, for the move ledger and the
generic runner) gives the rate at the job's start; the policies call ``goodput``.
"""
from __future__ import annotations

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
