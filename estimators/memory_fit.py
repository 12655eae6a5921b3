"""Memory fit of a grid's low-memory plans, shared by the planner (the grid memory
margin on a proxy plan's feasibility) and the grid enumeration (``estimators.grids``,
whose module doc describes the low-memory plans). Kept apart from both so that neither
imports the other."""
from __future__ import annotations

from typing import TYPE_CHECKING

from instances.arch import ModelArch
from instances.gpus import get_gpu
from instances.grid import Grid, Shape

from .layers import expert_parallel_degree

if TYPE_CHECKING:
    from .planner import Planner


def shape_fits_with_margin(arch: ModelArch, global_batch: int, shape: Shape, planner: Planner) -> bool:
    """True when the lowest-memory plan over the shape's pipeline depths, times
    ``MemoryConfig.grid_margin``, fits (cached in the planner)."""
    key = (arch, global_batch, shape, "margin")
    hit = planner.fits_cache.get(key)
    if hit is None:
        gpu, n = get_gpu(shape.gpu_type), shape.num_gpus
        hit = planner.fits_cache[key] = any(
            mem.fits(gpu, planner.cfg.memory, planner.cfg.memory.grid_margin)
            for pp in range(1, n + 1) if n % pp == 0
            for mem in low_memory_plans(arch, global_batch, Grid(shape, pp), planner, False))
    return hit


def low_memory_plans(arch: ModelArch, global_batch: int, grid: Grid, planner: Planner, dp_only: bool):
    """Memory of the low-memory plans of a grid (module doc), lazily."""
    pp = grid.pp
    if pp > len(arch.layers()) or (dp_only and pp > 1):
        return
    gpu = get_gpu(grid.gpu_type)
    splits = {planner.split(arch, gpu, pp), planner.memory_split(arch, global_batch, grid)}
    for tp in planner.tp_options(arch, grid, within_node=False, dp_only=dp_only, global_batch=global_batch):
        dp = grid.num_gpus // pp // tp
        per_replica = max(1, -(-global_batch // dp))
        # one sample per micro-batch; pure DP without gradient accumulation: the whole batch at once
        mb, m = (1, per_replica) if planner.accumulates(dp_only) else (per_replica, 1)
        for split in splits:
            yield planner.memtable(arch, mb, tp, dp, grid.shape.gpus_per_node,
                                   expert_parallel_degree(arch, dp)).breakdown(split, m, "1f1b")
