"""The executor seam: simulated and real execution behind one interface.

``SimExecutor`` (engine/sim_executor.py) advances jobs at the oracle's true speed and
charges reconfiguration downtime; ``launcher.mpi_executor.MpiExecutor`` launches,
stops, checkpoints and relaunches real torch jobs. The launcher does not import the
engine: it satisfies this protocol structurally.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from instances.jobs import Job

from .context import Allocation


@dataclass(frozen=True)
class JobProgress:
    job_id: str
    iterations_done: float
    running: bool
    finished: bool = False
    finished_at_s: float | None = None
    failed: str | None = None                 # reason, when the job's run failed
    last_checkpoint_iteration: float = 0.0
    measured_iteration_time_s: float | None = None


class Executor(Protocol):
    def launch(self, job: Job, alloc: Allocation, plan: Any, now_s: float) -> None:
        """Start ``job`` on ``alloc`` (resuming from its last checkpoint, if any)."""

    def stop(self, job_id: str, now_s: float) -> None:
        """Stop a running job, checkpointing first; its progress is kept."""

    def reconfigure(self, job_id: str, alloc: Allocation, plan: Any, now_s: float) -> None:
        """Move a running job to another allocation/plan (stop, reshard, relaunch)."""

    def progress(self, job_id: str) -> JobProgress:
        """Iterations done, last checkpoint, liveness."""

    def advance(self, until_s: float) -> list[JobProgress]:
        """Run (simulated) or wait (live) until ``until_s``; return the jobs that finished
        or failed meanwhile, with the time they did."""
