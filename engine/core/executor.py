"""The executor seam: simulated and real execution behind one interface.

``SimExecutor`` (engine/sim/sim_executor.py) advances jobs at the oracle's true speed and
charges reconfiguration downtime; ``launcher.mpi_executor.MpiExecutor`` launches,
stops, checkpoints and relaunches real torch jobs. The launcher does not import the
engine: it satisfies this protocol structurally. The round loop (engine/core/round_loop.py)
reads nothing of an executor but this protocol.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from instances.allocation import Allocation
from instances.grid import Shape
from instances.jobs import Job
from instances.plan import JobPlan
from instances.quick_init import quick_init


@quick_init
@dataclass(frozen=True)
class JobProgress:
    job_id: str
    iterations_done: float                    # what the job keeps (live, when not running: its checkpoint)
    running: bool
    finished: bool = False
    finished_at_s: float | None = None        # when it finished or its run failed
    failed: str | None = None                 # reason, when the job's run failed
    final: bool = False                       # that failure recurs on any retry (a non-finite loss, a refused
                                              # data file): the job fails for good at once
    last_checkpoint_iteration: float = 0.0
    measured_iteration_time_s: float | None = None   # mean over the next field's iterations
    measured_iterations: float = 0.0          # iterations measured on the current allocation since it started
    wall_iteration_time_s: float | None = None   # wall-clock seconds per iteration over those iterations (every
                                              # pause included: checkpoints, a live --step-delay); None: as measured
    launch_lost_gpu_s: float = 0.0            # GPU-seconds held while (re)starting from the queue
    reconfig_lost_gpu_s: float = 0.0          # GPU-seconds held while moving


@dataclass(frozen=True)
class ExecutorTotals:
    """Cluster-wide counters since the executor started (the loop accounts rounds by
    differences of these)."""
    samples_done: float                       # training samples processed by all jobs
    reconfig_lost_gpu_s: float                # GPU-seconds held in reconfiguration downtime


class Executor(Protocol):
    def launch(self, job: Job, alloc: Allocation, plan: JobPlan | None, now_s: float) -> None:
        """Start ``job`` on ``alloc`` (resuming from its last checkpoint, if any)."""

    def stop(self, job_id: str, now_s: float) -> None:
        """Stop a running job, checkpointing first; its progress is kept."""

    def release(self, job_id: str, now_s: float, *, target: Allocation | None = None) -> None:
        """A running job is about to move: free its GPUs now (live: stop it with a
        checkpoint), so that jobs moving onto them in the same round find them free.
        ``reconfigure`` follows for the same job in the same round. ``target``: the
        allocation it moves to (an executor whose device-to-device moves depend on where
        the job goes reads it; the round loop always passes it)."""

    def reconfigure(self, job_id: str, alloc: Allocation, plan: JobPlan | None, now_s: float) -> None:
        """Move a running job to another allocation/plan (stop unless released, reshard,
        relaunch)."""

    def progress(self, job_id: str) -> JobProgress:
        """Iterations done, last checkpoint, liveness, measured speed, time lost."""

    def advance(self, until_s: float) -> list[JobProgress]:
        """Run (simulated) or wait (live) until ``until_s``; return the jobs that finished
        or failed meanwhile, with the time they did."""

    def runs_on(self, job: Job, shape: Shape) -> bool:
        """False when ``job`` is known not to run on ``shape`` (the oracle says so in
        simulation; live, a launch there ran out of memory)."""

    def totals(self) -> ExecutorTotals:
        """Samples processed and GPU-seconds lost to moves, cluster-wide, so far."""


class AdoptingExecutor(Executor, Protocol):
    """A live executor that can take over launches an earlier process started (the
    service's re-adoption after a restart: ``RoundLoop.adopt_running``)."""

    def adopt(self, job: Job, alloc: Allocation, plan: JobPlan | None, launch_index: int) -> JobProgress | None:
        """Take over launch ``launch_index`` of ``job`` (on ``alloc`` with ``plan``) without
        touching it: no relaunch; its progress, stop and moves as for a launch of this
        executor's own. A launch that ended meanwhile is accounted (finished or failed)
        and reported by the next ``advance``. None when no such launch is known."""
