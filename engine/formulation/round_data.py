"""What one round's optimization reads: jobs and candidate columns as arrays.

A *column* is one candidate (job, grid) with its estimate. The formulation keeps only
the best pipeline depth per (job, GPU type, nodes, GPUs per node): the scheduler
chooses shapes, the planner the depth inside (for a running job, its current grid is
kept for its current shape, so that staying put is not mistaken for a move).

Capacity is described per GPU type and level l in {1, 2, 4, ... node size}: the number
of disjoint aligned l-GPU blocks the nodes of that type offer (sum over nodes of
floor(GPUs / l)). See ``build.py`` for how the node-shape rows use it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from estimators.base import LearnsOnline
from instances.cluster import ClusterSpec
from instances.grid import Grid
from instances.jobs import Job

from ..context import JobView, RoundContext


@dataclass(frozen=True)
class Capacity:
    """Aligned-block capacity per GPU type: ``blocks[t][l]`` for levels l = 1, 2, 4, ..."""
    types: tuple[str, ...]
    levels: tuple[tuple[int, ...], ...]          # per type, ascending powers of two
    blocks: tuple[tuple[int, ...], ...]          # per type, per level
    max_gpus_per_node: tuple[int, ...]

    @classmethod
    def from_node_sizes(cls, node_sizes: dict[str, list[int]]) -> "Capacity":
        types = tuple(sorted(node_sizes))
        levels, blocks, mx = [], [], []
        for t in types:
            sizes = node_sizes[t]
            top = max(sizes)
            lv = tuple(2 ** k for k in range(int(math.log2(top)) + 1))
            levels.append(lv)
            blocks.append(tuple(sum(s // l for s in sizes) for l in lv))
            mx.append(top)
        return cls(types, tuple(levels), tuple(blocks), tuple(mx))

    @classmethod
    def from_cluster(cls, cluster: ClusterSpec) -> "Capacity":
        sizes: dict[str, list[int]] = {}
        for g in cluster.groups:
            sizes.setdefault(g.gpu_type, []).extend([g.gpus_per_node] * g.num_nodes)
        return cls.from_node_sizes(sizes)

    def total(self, type_index: int) -> int:
        return self.blocks[type_index][0]


@dataclass(frozen=True, eq=False)
class RoundData:
    """Jobs (index j) and candidate columns (index k) of one round, as arrays."""
    now_s: float
    round_interval_s: float
    capacity: Capacity
    # per job
    job_ids: tuple[str, ...]
    remaining_iterations: np.ndarray
    ref_throughput: np.ndarray           # samples/s on the job's reference allocation
    global_batch: np.ndarray             # samples per iteration
    current_col: np.ndarray              # column the job runs on now, -1 if none
    running: np.ndarray                  # bool: holds GPUs now
    queued_s: np.ndarray
    deadline_s: np.ndarray               # absolute; +inf when none
    priority: np.ndarray
    tenants: tuple[str, ...]
    requested_gpus: np.ndarray           # 0 when not given
    requested_type: tuple[str | None, ...]
    # per column
    col_job: np.ndarray
    col_type: np.ndarray                 # index into capacity.types
    col_nodes: np.ndarray
    col_gpn: np.ndarray                  # GPUs per node
    col_pp: np.ndarray
    col_throughput: np.ndarray           # samples/s, estimated
    col_reconfig_s: np.ndarray           # downtime if the job moves here (0 to stay or start)
    grids: tuple[Grid | None, ...] = ()
    plans: tuple[Any, ...] = ()
    unschedulable: tuple[str, ...] = ()  # jobs with no feasible candidate this round
    jobs: tuple[Any, ...] = field(default=())   # the Job objects (empty for synthetic rounds)
    attained_gpu_s: np.ndarray | None = None     # per job, GPU-seconds received so far
    arrival_s: np.ndarray | None = None          # per job

    @property
    def n_jobs(self) -> int:
        return len(self.job_ids)

    @property
    def n_cols(self) -> int:
        return len(self.col_job)

    @property
    def col_gpus(self) -> np.ndarray:
        return self.col_nodes * self.col_gpn

    @property
    def speedup(self) -> np.ndarray:
        """Per column: estimated throughput over the job's reference throughput."""
        return self.col_throughput / self.ref_throughput[self.col_job]

    @property
    def remaining_time_ref_s(self) -> np.ndarray:
        """Per job: time to finish at the reference throughput."""
        return self.remaining_iterations * self.global_batch / self.ref_throughput

    def col_rate_iters_per_s(self) -> np.ndarray:
        return self.col_throughput / self.global_batch[self.col_job]


GridsFn = Callable[..., list[Grid]]


def default_grids_fn() -> GridsFn:
    """The estimators' candidate-grid enumeration."""
    from estimators.grids import candidate_grids
    return candidate_grids


def _reconfig_cost_s(ctx: RoundContext, view: JobView, grid: Grid) -> float:
    if ctx.reconfig is None:
        return 0.0
    return float(ctx.reconfig.cost_to_grid_s(view.job, view.current, grid))


class GridCache:
    """Candidate grids per (model, global batch, cluster, GPU cap): they depend on the
    job only through those, so a policy enumerates them once per such key."""

    def __init__(self, dp_only: bool = False):
        self.dp_only = dp_only
        self._cache: dict = {}

    def __call__(self, job: Job, cluster: ClusterSpec, max_gpus: int) -> list[Grid]:
        key = (job.model, job.global_batch, id(cluster), max_gpus)
        grids = self._cache.get(key)
        if grids is None:
            from estimators.grids import candidate_grids
            grids = self._cache[key] = candidate_grids(job, cluster, max_gpus=max_gpus, dp_only=self.dp_only)
        return grids


_OWN = "job"      # estimate_cache keys (_OWN, job id): one job's own estimates


def _estimate_memo(cache: dict, perf, job: Job) -> dict:
    """The memo of ``job``'s estimates by grid: shared by its (model, global batch), or its
    own while a performance model that learns online has observations of it (replaced
    whenever its ``estimate_key`` changes, so no estimate is served stale)."""
    key = perf.estimate_key(job) if isinstance(perf, LearnsOnline) else None
    if key is None:
        return cache.setdefault((job.model, job.global_batch), {})
    own = cache.get((_OWN, job.job_id))
    if own is None or own[0] != key:
        own = cache[(_OWN, job.job_id)] = (key, {})
    return own[1]


def build_round_data(ctx: RoundContext, perf, *, grids_fn: GridsFn | None = None,
                     max_gpus: int = 16, grid_filter: Callable[[Any, Grid], bool] | None = None,
                     estimate_cache: dict | None = None) -> RoundData:
    """Enumerate candidate grids for every job in ``ctx``, estimate them with ``perf``
    and keep the best pipeline depth per shape.

    ``grid_filter(job_view, grid)`` drops candidates (baselines that keep the user's
    GPU count). ``estimate_cache`` memoizes estimates by (model, global batch, grid):
    estimates depend on the job only through its model and batch — except with a
    performance model that learns online (``estimators.LearnsOnline``) for a job it has
    observations of: those are memoized per job under its ``estimate_key``, dropped when
    the key changes or the job leaves the round (``_estimate_memo``).
    """
    grids_fn = grids_fn or default_grids_fn()
    cap = Capacity.from_cluster(ctx.cluster)
    type_index = {t: i for i, t in enumerate(cap.types)}
    cache = estimate_cache if estimate_cache is not None else {}

    job_ids, rem, gb, cur_col, running, queued, deadline, prio, tenants, req_g, req_t = ([] for _ in range(11))
    attained, arrival = [], []
    jobs = []
    c_job, c_type, c_nodes, c_gpn, c_pp, c_tp, c_rc, c_grid, c_plan = ([] for _ in range(9))
    ref = []
    unschedulable = []
    if isinstance(perf, LearnsOnline):
        present = {v.job.job_id for v in ctx.jobs}
        for k in [k for k in cache if k[0] == _OWN and k[1] not in present]:
            del cache[k]
    for view in ctx.jobs:
        job = view.job
        memo = _estimate_memo(cache, perf, job)
        best: dict[tuple, tuple[float, Grid, Any]] = {}
        cur_grid = view.current.grid if view.current is not None else None
        for grid in grids_fn(job, ctx.cluster, max_gpus=max_gpus):
            t = grid.gpu_type
            if t not in type_index or grid.shape.gpus_per_node > cap.max_gpus_per_node[type_index[t]]:
                continue
            if grid_filter is not None and not grid_filter(view, grid):
                continue
            est = memo.get(grid)
            if est is None:
                est = memo[grid] = perf.estimate(job, grid)
            if not est.feasible or not est.throughput > 0 or not math.isfinite(est.throughput):
                continue
            skey = (t, grid.shape.num_nodes, grid.shape.gpus_per_node)
            value = est.throughput
            if cur_grid is not None and grid == cur_grid:
                value = math.inf          # keep the current grid for the current shape
            if skey not in best or value > best[skey][0]:
                best[skey] = (value, grid, est)
        if not best:
            unschedulable.append(job.job_id)
            continue
        j = len(job_ids)
        job_ids.append(job.job_id)
        jobs.append(job)
        rem.append(max(float(view.remaining_iterations), 0.0))
        gb.append(float(job.global_batch))
        running.append(view.current is not None)
        queued.append(float(view.queued_s))
        attained.append(float(view.attained_gpu_s))
        arrival.append(float(job.arrival_s))
        deadline.append(float(job.deadline_s) if job.deadline_s is not None else math.inf)
        prio.append(float(job.priority))
        tenants.append(job.tenant)
        req_g.append(int(job.requested_gpus or 0))
        req_t.append(job.requested_gpu_type)
        cc = -1
        thr_of = {}
        for skey in sorted(best):
            _, grid, est = best[skey]
            k = len(c_job)
            if grid == cur_grid:
                cc = k
            c_job.append(j)
            c_type.append(type_index[grid.gpu_type])
            c_nodes.append(grid.shape.num_nodes)
            c_gpn.append(grid.shape.gpus_per_node)
            c_pp.append(grid.pp)
            c_tp.append(float(est.throughput))
            c_rc.append(_reconfig_cost_s(ctx, view, grid))
            c_grid.append(grid)
            c_plan.append(est.plan)
            thr_of[skey] = float(est.throughput)
        cur_col.append(cc)
        ref.append(_reference_throughput(job, thr_of))
    return RoundData(
        now_s=float(ctx.now_s), round_interval_s=float(ctx.round_interval_s), capacity=cap,
        job_ids=tuple(job_ids), remaining_iterations=np.array(rem), ref_throughput=np.array(ref),
        global_batch=np.array(gb), current_col=np.array(cur_col, dtype=np.int64),
        running=np.array(running, dtype=bool), queued_s=np.array(queued), deadline_s=np.array(deadline),
        priority=np.array(prio), tenants=tuple(tenants), requested_gpus=np.array(req_g, dtype=np.int64),
        requested_type=tuple(req_t), col_job=np.array(c_job, dtype=np.int64),
        col_type=np.array(c_type, dtype=np.int64), col_nodes=np.array(c_nodes, dtype=np.int64),
        col_gpn=np.array(c_gpn, dtype=np.int64), col_pp=np.array(c_pp, dtype=np.int64),
        col_throughput=np.array(c_tp), col_reconfig_s=np.array(c_rc), grids=tuple(c_grid),
        plans=tuple(c_plan), unschedulable=tuple(unschedulable), jobs=tuple(jobs),
        attained_gpu_s=np.array(attained), arrival_s=np.array(arrival))


def _reference_throughput(job, thr_of: dict[tuple, float]) -> float:
    """The job's reference allocation: the GPU type and count the user asked for (best
    shape), else the requested count on any type, else the smallest count it fits on."""
    want_g, want_t = job.requested_gpus, job.requested_gpu_type
    if want_g:
        same = [v for (t, n, m), v in thr_of.items() if n * m == want_g and (want_t is None or t == want_t)]
        if same:
            return max(same)
        same = [v for (t, n, m), v in thr_of.items() if n * m == want_g]
        if same:
            return max(same)
    smallest = min(n * m for (_, n, m) in thr_of)
    return max(v for (t, n, m), v in thr_of.items() if n * m == smallest)


def columns_of_jobs(data: RoundData) -> list[np.ndarray]:
    """Column indices per job (columns are stored grouped by job)."""
    bounds = np.searchsorted(data.col_job, np.arange(data.n_jobs + 1))
    return [np.arange(bounds[j], bounds[j + 1]) for j in range(data.n_jobs)]


def find_column(data: RoundData, job_index: int, grid: Grid) -> int:
    lo, hi = np.searchsorted(data.col_job, [job_index, job_index + 1])
    for k in range(lo, hi):
        if data.grids and data.grids[k] == grid:
            return int(k)
    return -1
