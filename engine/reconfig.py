"""Reconfiguration cost: one validated model that prices every move, for every policy.

A job whose allocation changes stops, re-plans, moves its state and restarts. The
model charges, in seconds of downtime during which the job holds its new GPUs but
makes no progress:

- **re-planning**: ``replan_per_gpu_s`` per GPU of the new allocation, capped at
  ``replan_cap_s``. Defaults are the Arena (EuroSys'26) artifact's figure for its pruned
  plan search: 10 s per GPU, at most 40 s. (The artifact charged its baselines 150 s per
  GPU, at most 600 s, for an unpruned search; here every policy pays the same cost, so
  comparisons are fair.)
- **restart**: ``restart_s`` once per (re)start — process launch, checkpoint load,
  warm-up. Default 0 s, like the artifact's checkpoint-resume term.
- **state movement** (optional, off by default): the model state
  (``param_count x state_bytes_per_param``; 16 bytes/param = fp16 weights and gradients
  plus fp32 master weights and two Adam moments) read back in parallel by every GPU of
  the new allocation at ``state_bw_bytes_per_s`` each. An approximation: it ignores
  sharding overlap between old and new layouts and assumes the transfer is
  bandwidth-bound.

A launch from the queue (``old is None``) is charged the same terms when
``charge_launch`` is True (default: the artifact counted a job's first placement as a
GPU change too). An allocation that is unchanged (same grid, same GPUs) costs 0.
A grid change on the same GPUs (e.g. a different pipeline depth) is a plan change and
is charged.

Downtime longer than a round carries into the next rounds (the executor keeps the job
paused until it has elapsed).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from instances.grid import Grid
from instances.jobs import Job
from instances.memory_rule import ADAM_STATE_BYTES_PER_PARAM

from .context import Allocation


def nominal_allocation(grid: Grid) -> Allocation:
    """An allocation of ``grid`` on not-yet-chosen GPUs (node id -1): the cost model prices
    by grid; placement chooses the GPUs after the decision."""
    return Allocation(grid, tuple((-1, i) for i in range(grid.num_gpus)))


@dataclass(frozen=True)
class ReconfigCostModel:
    replan_per_gpu_s: float = 10.0
    replan_cap_s: float = 40.0
    restart_s: float = 0.0
    state_bw_bytes_per_s: float | None = None
    state_bytes_per_param: float = ADAM_STATE_BYTES_PER_PARAM      # 16: instances.memory_rule
    charge_launch: bool = True

    def __post_init__(self):
        for f in ("replan_per_gpu_s", "replan_cap_s", "restart_s", "state_bytes_per_param"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ValueError(f"ReconfigCostModel.{f} must be a finite number >= 0, got {v!r}")
        bw = self.state_bw_bytes_per_s
        if bw is not None and (not isinstance(bw, (int, float)) or not math.isfinite(bw) or bw <= 0):
            raise ValueError(f"ReconfigCostModel.state_bw_bytes_per_s must be > 0 or None, got {bw!r}")
        if not isinstance(self.charge_launch, bool):
            raise ValueError("ReconfigCostModel.charge_launch must be a bool")

    def state_bytes(self, job: Job) -> float:
        return job.arch.param_count * self.state_bytes_per_param

    def cost_s(self, job: Job, old: Allocation | None, new: Allocation) -> float:
        """Downtime in seconds for moving ``job`` from ``old`` (None: queued) to ``new``."""
        if old is not None and old.grid == new.grid and old.gpus == new.gpus:
            return 0.0
        if old is None and not self.charge_launch:
            return 0.0
        cost = min(self.replan_per_gpu_s * new.grid.num_gpus, self.replan_cap_s) + self.restart_s
        if self.state_bw_bytes_per_s is not None:
            cost += self.state_bytes(job) / (self.state_bw_bytes_per_s * new.grid.num_gpus)
        return cost

    def cost_to_grid_s(self, job: Job, old: Allocation | None, grid: Grid) -> float:
        """Downtime for moving ``job`` to ``grid`` before its GPUs are chosen (what a policy
        prices): 0 when it keeps its grid, else ``cost_s`` to the grid's nominal allocation."""
        if old is not None and old.grid == grid:
            return 0.0
        return self.cost_s(job, old, nominal_allocation(grid))

    @classmethod
    def from_options(cls, opts: dict) -> "ReconfigCostModel":
        """Build from a plain mapping (e.g. CLI options); unknown keys are an error."""
        known = set(cls.__dataclass_fields__)
        bad = sorted(set(opts) - known)
        if bad:
            raise ValueError(f"unknown reconfiguration cost option(s) {bad}; known: {sorted(known)}")
        return cls(**opts)
