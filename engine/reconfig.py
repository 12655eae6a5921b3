"""Reconfiguration cost: one validated model that prices every move, for every policy.

The same ``ReconfigCostModel`` prices a move in the policies' objective and charges it
as downtime in the simulator's truth (``SimExecutor``): seconds during which a moved job
holds its new GPUs but makes no progress. Two named settings (``PRESETS``, CLI
``--reconfig-opt preset=NAME``; other options override a preset's fields):

- ``arena`` (default): the Arena (EuroSys'26) artifact's figure — re-planning at
  ``replan_per_gpu_s`` = 10 s per GPU of the new allocation, at most ``replan_cap_s`` =
  40 s; restart 0; no state movement. (The artifact charged its baselines 150 s per GPU,
  at most 600 s, for an unpruned search; here every policy pays the same cost.)
- ``realistic``: a move as our launcher carries it out on a GPU cluster, in parts (see
  docs/simulator.md for the figures and their sources): ``drain_s`` to stop the old
  ranks, ``restart_s`` for process and communicator start-up, ``warmup_s`` for the first
  slow steps, and the state movement over ``state_path``: ``d2d`` sends only the bytes
  that change owner between the old and new layouts, device to device at
  ``d2d_bytes_per_s`` per receiving GPU; ``storage`` writes the whole state and reads it
  back at ``storage_bytes_per_s`` (a checkpoint through shared storage). A resume after
  preemption always reads its state from storage (it left its GPUs). No re-planning
  (the planner's search takes milliseconds).

The model state is ``param_count x state_bytes_per_param`` (16 B/param: fp16 weights
and gradients plus fp32 master weights and two Adam moments, instances.memory_rule).
Bytes that change owner are counted under the uniform-layers approximation of
``changed_owner_bytes``.

A launch from the queue (``old is None``) is charged restart and warm-up (and
re-planning) when ``charge_launch`` is True (default: the artifact counted a job's first
placement as a GPU change too). An allocation that is unchanged (same grid, same GPUs)
costs 0. A grid change on the same GPUs (e.g. a different pipeline depth) is a plan
change and is charged. Downtime longer than a round carries into the next rounds.
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


Layout = tuple[int, int, int]          # (dp, tp, pp)

STATE_PATHS = ("none", "d2d", "storage")


def changed_owner_bytes(state_bytes: float, old: Layout, new: Layout, kept_ranks: int) -> float:
    """Bytes the ranks of layout ``new`` must receive when the first ``kept_ranks`` rank
    positions stay on the same devices as in layout ``old``.

    Uniform-layers approximation: the state is spread evenly over the layers; rank
    position ``i`` is (pipeline stage, data replica, tensor slice) with the tensor index
    fastest, then data, then stage; a rank holds its stage's layers' 1/tp slice (every
    data replica holds a full copy). A kept rank already holds the overlap of its old and
    new slices; everything else it needs is received."""
    def rect(layout: Layout, i: int) -> tuple[float, float, float, float]:
        dp, tp, pp = layout
        t, rest = i % tp, i // tp
        stage = rest // dp
        return stage / pp, (stage + 1) / pp, t / tp, (t + 1) / tp

    n_new = new[0] * new[1] * new[2]
    n_old = old[0] * old[1] * old[2]
    need = n_new * (1.0 / (new[1] * new[2]))
    have = 0.0
    for i in range(min(kept_ranks, n_new, n_old)):
        a0, a1, b0, b1 = rect(old, i)
        c0, c1, d0, d1 = rect(new, i)
        have += max(0.0, min(a1, c1) - max(a0, c0)) * max(0.0, min(b1, d1) - max(b0, d0))
    return state_bytes * (need - have)


def _layout(grid: Grid) -> Layout:
    """A grid's layout for pricing: tensor parallelism is the plan's business, so data
    ranks fill each stage (dp = GPUs / pp, tp = 1)."""
    return grid.num_gpus // grid.pp, 1, grid.pp


@dataclass(frozen=True)
class ReconfigCostModel:
    preset: str = "arena"               # which named setting this is (set by from_options)
    replan_per_gpu_s: float = 10.0
    replan_cap_s: float = 40.0
    restart_s: float = 0.0              # process and communicator start-up, per (re)start
    drain_s: float = 0.0                # stopping the old ranks of a moved running job
    warmup_s: float = 0.0               # first steps slower than steady state, per (re)start
    state_path: str = "none"            # none | d2d | storage: how a move's state travels
    d2d_bytes_per_s: float = 10e9       # per receiving GPU
    storage_bytes_per_s: float = 100e6  # per job, shared storage
    state_bytes_per_param: float = ADAM_STATE_BYTES_PER_PARAM      # 16: instances.memory_rule
    charge_launch: bool = True

    def __post_init__(self):
        for f in ("replan_per_gpu_s", "replan_cap_s", "restart_s", "drain_s", "warmup_s", "state_bytes_per_param"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ValueError(f"ReconfigCostModel.{f} must be a finite number >= 0, got {v!r}")
        for f in ("d2d_bytes_per_s", "storage_bytes_per_s"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"ReconfigCostModel.{f} must be a finite number > 0, got {v!r}")
        if self.state_path not in STATE_PATHS:
            raise ValueError(f"ReconfigCostModel.state_path must be one of {STATE_PATHS}, got {self.state_path!r}")
        if not isinstance(self.charge_launch, bool):
            raise ValueError("ReconfigCostModel.charge_launch must be a bool")

    def state_bytes(self, job: Job) -> float:
        return job.arch.param_count * self.state_bytes_per_param

    def moved_bytes(self, job: Job, old: Allocation | None, new: Allocation, resumed: bool = False) -> float:
        """Bytes of state moved: through storage (written and read back), or those that
        change owner device to device; a resume reads its whole state from storage."""
        if self.state_path == "none" or (old is None and not resumed):
            return 0.0
        s = self.state_bytes(job)
        if old is None or self.state_path == "storage":
            return 2.0 * s
        kept = 0
        for a, b in zip(old.gpus, new.gpus):
            if a != b:
                break
            kept += 1
        return changed_owner_bytes(s, _layout(old.grid), _layout(new.grid), kept)

    def cost_s(self, job: Job, old: Allocation | None, new: Allocation, resumed: bool = False) -> float:
        """Downtime in seconds for moving ``job`` from ``old`` (None: queued; ``resumed``:
        it ran before and was preempted) to ``new``."""
        if old is not None and old.grid == new.grid and old.gpus == new.gpus:
            return 0.0
        if old is None and not self.charge_launch:
            return 0.0
        cost = min(self.replan_per_gpu_s * new.grid.num_gpus, self.replan_cap_s) + self.restart_s + self.warmup_s
        if old is not None:
            cost += self.drain_s
        moved = self.moved_bytes(job, old, new, resumed)
        if moved:
            if old is None or self.state_path == "storage":
                cost += moved / self.storage_bytes_per_s
            else:
                cost += moved / (self.d2d_bytes_per_s * new.grid.num_gpus)
        return cost

    def cost_to_grid_s(self, job: Job, old: Allocation | None, grid: Grid, resumed: bool = False) -> float:
        """Downtime for moving ``job`` to ``grid`` before its GPUs are chosen (what a policy
        prices): 0 when it keeps its grid, else ``cost_s`` to the grid's nominal allocation,
        assuming a move on GPUs of the same type keeps the GPUs both grids can share."""
        if old is not None and old.grid == grid:
            return 0.0
        new = nominal_allocation(grid)
        if old is not None and old.grid.gpu_type == grid.gpu_type:
            n = min(len(old.gpus), len(new.gpus))
            new = Allocation(grid, old.gpus[:n] + new.gpus[n:])
        return self.cost_s(job, old, new, resumed)

    @classmethod
    def from_options(cls, opts: dict) -> "ReconfigCostModel":
        """Build from a plain mapping (e.g. CLI options): ``preset`` (default ``arena``)
        then field overrides; unknown keys are an error."""
        opts = dict(opts)
        name = str(opts.pop("preset", "arena"))
        if name not in PRESETS:
            raise ValueError(f"unknown reconfiguration cost preset {name!r}; known: {sorted(PRESETS)}")
        known = set(cls.__dataclass_fields__) - {"preset"}
        bad = sorted(set(opts) - known)
        if bad:
            raise ValueError(f"unknown reconfiguration cost option(s) {bad}; known: preset, {sorted(known)}")
        return cls(**{**PRESETS[name], **opts, "preset": name})


#: Named settings (field values); sources and the measured local calibration in docs/simulator.md.
PRESETS: dict[str, dict] = {
    "arena": {},
    "realistic": dict(replan_per_gpu_s=0.0, replan_cap_s=0.0, drain_s=5.0, restart_s=30.0, warmup_s=10.0,
                      state_path="d2d", d2d_bytes_per_s=10e9, storage_bytes_per_s=100e6),
}
