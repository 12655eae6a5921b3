"""Candidate grids of a job: GPU type x GPU count x GPUs per node x pipeline depth.

For each GPU type present in the cluster: GPU counts are powers of two up to
``max_gpus`` (or the explicit ``gpu_counts``) and at most the GPUs of that type in the
cluster; GPUs per node are powers of two up to that type's node size, with
``count / gpus_per_node`` nodes (which must exist); pipeline depths are the divisors of
the count, at most the model's layer count. A grid is dropped when no tensor degree
keeps its data-parallel degree at most the global batch (``planner`` module doc: no
replica without a sample), even with ``prune=False``. A grid is pruned when even its
lowest-memory plan does not fit: every tensor degree dividing a stage, micro-batch
count equal to the per-replica batch (one sample per micro-batch; pure data parallelism
without gradient accumulation, ``PlannerConfig.dp_only_grad_accumulation``: the whole
per-replica batch in one), 1F1B, the
time-balanced or the memory-balanced stage split. (An approximation of "lowest memory":
other splits could fit where these two do not; the planner searches only these too.)
Outside pure data parallelism the lowest-memory plan over the shape's pipeline depths
must also fit with ``MemoryConfig.grid_margin`` (1.0 by default; the Arena runtime's,
chosen on its out-of-memory rows, in ``instances.memory_rule``): a shape the runtime's
plan search would not fit loses all its grids; the planner's proxy calls such a grid
infeasible too.
"""
from __future__ import annotations

from functools import lru_cache

from instances.arch import ModelArch
from instances.cluster import ClusterSpec
from instances.gpus import get_gpu
from instances.grid import Grid, pow2_upto
from instances.jobs import Job

from .config import EstimatorConfig
from .planner import Planner, low_memory_plans, shape_fits_with_margin


def grid_fits(arch: ModelArch, global_batch: int, grid: Grid, planner: Planner, *, dp_only: bool = False) -> bool:
    """True when the grid's lowest-memory plan fits in GPU memory (cached in the planner)."""
    key = (arch, global_batch, grid, dp_only)
    hit = planner.fits_cache.get(key)
    if hit is None:
        hit = planner.fits_cache[key] = _grid_fits(arch, global_batch, grid, planner, dp_only)
    return hit


def _grid_fits(arch: ModelArch, global_batch: int, grid: Grid, planner: Planner, dp_only: bool) -> bool:
    gpu = get_gpu(grid.gpu_type)
    if not any(mem.fits(gpu, planner.cfg.memory) for mem in low_memory_plans(arch, global_batch, grid, planner,
                                                                              dp_only)):
        return False
    margin = planner.cfg.memory.grid_margin
    if dp_only or margin == 1.0:              # pure DP: one plan, no plan search that could miss it
        return True
    return shape_fits_with_margin(arch, global_batch, grid.shape, planner)


def lowest_memory_bytes(arch: ModelArch, global_batch: int, grid: Grid, planner: Planner, *,
                        dp_only: bool = False) -> float | None:
    """Per-rank peak memory of the grid's lowest-memory plan (the plans ``grid_fits``
    checks); None when the grid has no plan at all (pipeline deeper than the model)."""
    peaks = [mem.peak_bytes for mem in low_memory_plans(arch, global_batch, grid, planner, dp_only)]
    return min(peaks) if peaks else None


@lru_cache(maxsize=1)
def default_planner() -> Planner:
    """The planner (and its caches) shared by callers that do not pass their own; built
    from the default EstimatorConfig."""
    return Planner(EstimatorConfig())


def candidate_grids(job: Job, cluster: ClusterSpec, *, max_gpus: int = 16, gpu_counts=None,
                    planner: Planner | None = None, dp_only: bool = False, prune: bool = True) -> list[Grid]:
    """Every grid of ``job`` on ``cluster`` (see module doc), memory-infeasible ones pruned.
    Results are cached in the planner per (model, batch, cluster, counts, dp_only, prune)."""
    if max_gpus < 1:
        raise ValueError("max_gpus must be >= 1")
    counts = sorted(set(gpu_counts)) if gpu_counts is not None else pow2_upto(max_gpus)
    if any((not isinstance(c, int)) or c < 1 for c in counts):
        raise ValueError(f"gpu_counts must be positive integers, got {gpu_counts!r}")
    planner = planner or default_planner()
    key = (job.model, job.global_batch, cluster, tuple(counts), dp_only, prune)
    hit = planner.grids_cache.get(key)
    if hit is None:
        hit = planner.grids_cache[key] = tuple(_candidate_grids(job, cluster, counts, planner, dp_only, prune))
    return list(hit)


def _candidate_grids(job: Job, cluster: ClusterSpec, counts: list[int], planner: Planner, dp_only: bool,
                     prune: bool) -> list[Grid]:
    arch = job.arch
    n_layers = len(arch.layers())
    out = []
    for shape in cluster.shapes(counts):
        count = shape.num_gpus
        for pp in range(1, min(count, n_layers) + 1):
            if count % pp or (dp_only and pp > 1):
                continue
            grid = Grid(shape, pp)
            if not planner.tp_options(arch, grid, within_node=False, dp_only=dp_only,
                                      global_batch=job.global_batch):
                continue            # every plan would have more replicas than samples
            if prune and not grid_fits(arch, job.global_batch, grid, planner, dp_only=dp_only):
                continue
            out.append(grid)
    return out
