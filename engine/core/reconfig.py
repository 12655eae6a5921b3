"""Reconfiguration cost: one validated model that prices every move, for every policy.

The same ``ReconfigCostModel`` prices a move in the policies' objective and charges it
as downtime in the simulator's truth (``SimExecutor``): seconds during which a moved job
holds its new GPUs but makes no progress. Named settings (``PRESETS``, CLI
``--reconfig-opt preset=NAME``; other options override a preset's fields, or the
fields of its ``MoveCostParams``):

- ``arena`` (default): the Arena (EuroSys'26) artifact's figure — re-planning at
  ``replan_per_gpu_s`` = 10 s per GPU of the new allocation, at most ``replan_cap_s`` =
  40 s; restart 0; no state movement. (The artifact charged its baselines 150 s per GPU,
  at most 600 s, for an unpruned search; here every policy pays the same cost.)
- ``realistic``: a move as our launcher carries it out, priced by the launcher's own
  move-cost model (``estimators.move_cost.MoveCostParams``) with its published GPU-cluster
  defaults: drain, state movement (device to device, only the bytes that change owner,
  ``launcher.reshard_plan.changed_owner_bytes``; or through storage), start-up (fresh
  processes when the job grows or goes through storage, else a regroup of the running
  ranks) and warm-up. No re-planning (the planner takes milliseconds).
- ``local``: the same model calibrated from the moves measured on this project's machine
  (``MoveCostParams.measured_here()``, docs/launcher.md).
- ``sia``: the Sia artifact's own charge, for its goodput jobs (instances/goodput.py): every
  start, move or resume costs the job's restart time (``GoodputJob.restart_s``, the
  artifact's per-application ``rescale_time``: 25 s to 250 s), whatever the GPUs; the
  default on ``sia:`` instances.

With a move-cost model: a first start costs start-up + warm-up; a resume after preemption
is a move through storage (its state was written when it stopped and is read back); a
move of a running job goes over ``state_path`` (``d2d`` or ``storage``). The state is
``param_count x state_bytes_per_param`` (16 B/param: fp16 weights and gradients plus
fp32 master weights and two Adam moments, instances.memory_rule). Layouts for pricing
are (dp = GPUs / pp, 1, pp): tensor parallelism is the plan's business.

A launch from the queue is charged only when ``charge_launch`` is True (default: the
artifact counted a job's first placement as a GPU change too). An allocation that is
unchanged (same grid, same GPUs) costs 0. A grid change on the same GPUs (e.g. a
different pipeline depth) is a plan change and is charged. Downtime longer than a round
carries into the next rounds.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from estimators.move_cost import MoveCostParams
from instances.allocation import Allocation
from instances.grid import Grid
from instances.jobs import Job
from instances.limits import MAX_TIME_S, TIME_BOUND, is_number
from instances.memory_rule import ADAM_STATE_BYTES_PER_PARAM

STATE_PATHS = ("d2d", "storage")


def _layout(grid: Grid) -> tuple[int, int, int]:
    """A grid's layout for pricing: data ranks fill each stage (dp = GPUs / pp, tp = 1)."""
    return grid.num_gpus // grid.pp, 1, grid.pp


def nominal_allocation(grid: Grid) -> Allocation:
    """An allocation of ``grid`` on not-yet-chosen GPUs (node id -1): the cost model prices
    by grid; placement chooses the GPUs after the decision."""
    return Allocation(grid, tuple((-1, i) for i in range(grid.num_gpus)))


@dataclass(frozen=True)
class ReconfigCostModel:
    preset: str = "arena"               # which named setting this is (set by from_options)
    replan_per_gpu_s: float = 10.0
    replan_cap_s: float = 40.0
    restart_s: float = 0.0              # arena setting: a fixed cost per (re)start
    moves: MoveCostParams | None = None     # the launcher's move-cost model (None: the arena figure only)
    state_path: str = "d2d"             # with ``moves``: how a running job's state moves
    state_bytes_per_param: float = ADAM_STATE_BYTES_PER_PARAM      # 16: instances.memory_rule
    charge_launch: bool = True
    job_restart: bool = False           # ``sia`` setting: each change costs the job's own ``restart_s``

    def __post_init__(self):
        for f in ("replan_per_gpu_s", "replan_cap_s", "restart_s", "state_bytes_per_param"):
            v = getattr(self, f)
            try:
                ok = is_number(v) and math.isfinite(float(v)) and v >= 0
            except OverflowError:               # an integer past float's range
                ok = False
            if not ok:
                raise ValueError(f"{f} must be a finite number >= 0, got {v!r}")
            if f.endswith("_s") and v > MAX_TIME_S:
                raise ValueError(f"{f} {TIME_BOUND}, got {v!r}")
        if self.state_path not in STATE_PATHS:
            raise ValueError(f"state_path must be one of {STATE_PATHS}, got {self.state_path!r}")
        if self.moves is not None and not isinstance(self.moves, MoveCostParams):
            raise ValueError("moves must be a MoveCostParams or None")
        if not isinstance(self.charge_launch, bool):
            raise ValueError("charge_launch must be a bool")
        if not isinstance(self.job_restart, bool):
            raise ValueError("job_restart must be a bool")

    def _job_restart_s(self, job: Job) -> float:
        restart = getattr(job, "restart_s", None)
        if restart is None:
            raise ValueError(f"move costs preset {self.preset!r} charge each job's own restart time; job "
                             f"{job.job_id} has none (only the Sia artifact's goodput jobs do)")
        return float(restart)

    def state_bytes(self, job: Job) -> float:
        return job.arch.param_count * self.state_bytes_per_param

    def cost_s(self, job: Job, old: Allocation | None, new: Allocation, resumed: bool = False) -> float:
        """Downtime in seconds for moving ``job`` from ``old`` (None: queued; ``resumed``:
        it ran before and was preempted) to ``new``."""
        if old is not None and old.grid == new.grid and old.gpus == new.gpus:
            return 0.0
        if old is None and not self.charge_launch:
            return 0.0
        cost = min(self.replan_per_gpu_s * new.grid.num_gpus, self.replan_cap_s) + self.restart_s
        if self.job_restart:
            cost += self._job_restart_s(job)
        m = self.moves
        if m is None:
            return cost
        if old is None and not resumed:                 # a first start: processes, no state
            return cost + m.startup_s + m.warmup_s
        if old is None:                                 # a resume: its state comes back from storage
            return cost + m.move_seconds(self.state_bytes(job), _layout(new.grid), _layout(new.grid),
                                         path="storage", kept_ranks=0)
        kept = 0
        for a, b in zip(old.gpus, new.gpus):
            if a != b:
                break
            kept += 1
        return cost + m.move_seconds(self.state_bytes(job), _layout(old.grid), _layout(new.grid),
                                     path=self.state_path, kept_ranks=kept)

    def cost_to_grid_s(self, job: Job, old: Allocation | None, grid: Grid, resumed: bool = False) -> float:
        """Downtime for moving ``job`` to ``grid`` before its GPUs are chosen (what a policy
        prices): 0 when it keeps its grid, else ``cost_s`` to the grid's nominal allocation,
        assuming a move on GPUs of the same type keeps the GPUs both grids can share."""
        if old is not None and old.grid == grid:
            return 0.0
        if self.moves is None:                      # ``cost_s`` without a move-cost model, GPUs aside
            if old is None and not self.charge_launch:
                return 0.0
            cost = min(self.replan_per_gpu_s * grid.num_gpus, self.replan_cap_s) + self.restart_s
            return cost + self._job_restart_s(job) if self.job_restart else cost
        new = nominal_allocation(grid)
        if old is not None and old.grid.gpu_type == grid.gpu_type:
            n = min(len(old.gpus), len(new.gpus))
            new = Allocation(grid, old.gpus[:n] + new.gpus[n:])
        return self.cost_s(job, old, new, resumed)

    @classmethod
    def from_options(cls, opts: dict) -> "ReconfigCostModel":
        """Build from a plain mapping (e.g. CLI options): ``preset`` (default ``arena``),
        then overrides of this model's fields or of its ``MoveCostParams`` fields
        (``startup_s=60``); unknown keys are an error."""
        opts = dict(opts)
        name = str(opts.pop("preset", "arena"))
        if name not in PRESETS:
            raise ValueError(f"unknown reconfiguration cost preset {name!r}; known: {sorted(PRESETS)}")
        base = PRESETS[name]()
        own = set(cls.__dataclass_fields__) - {"preset", "moves"}
        move_fields = {f.name for f in dataclasses.fields(MoveCostParams)}
        bad = sorted(set(opts) - own - move_fields)
        if bad:
            raise ValueError(f"unknown reconfiguration cost option(s) {bad}; known: preset, {sorted(own)}, and "
                             f"the move-cost parts {sorted(move_fields)} (presets realistic, local)")
        moved = {k: v for k, v in opts.items() if k in move_fields}
        if moved and base.moves is None:
            raise ValueError(f"{sorted(moved)} need a move-cost model: use preset=realistic or preset=local")
        moves = dataclasses.replace(base.moves, **moved) if moved and base.moves is not None else base.moves
        return dataclasses.replace(base, **{k: v for k, v in opts.items() if k in own}, moves=moves, preset=name)


#: Named settings; sources in docs/simulator.md and docs/launcher.md.
PRESETS = {
    "arena": ReconfigCostModel,
    "realistic": lambda: ReconfigCostModel(preset="realistic", replan_per_gpu_s=0.0, replan_cap_s=0.0,
                                           moves=MoveCostParams.gpu_cluster_defaults()),
    "local": lambda: ReconfigCostModel(preset="local", replan_per_gpu_s=0.0, replan_cap_s=0.0,
                                       moves=MoveCostParams.measured_here()),
    "sia": lambda: ReconfigCostModel(preset="sia", replan_per_gpu_s=0.0, replan_cap_s=0.0, job_restart=True),
}
