"""What one round's optimization reads: jobs and candidate columns as arrays.

A *column* is one candidate (job, grid) with its estimate. The formulation keeps only
the best pipeline depth per (job, GPU type, nodes, GPUs per node): the scheduler
chooses shapes, the planner the depth inside (for a running job, its current grid is
kept for its current shape, so that staying put is not mistaken for a move).

Capacity is described per GPU type and level l in {1, 2, 4, ... node size}: the number
of disjoint l-GPU blocks the nodes of that type offer (sum over nodes of floor(GPUs / l)).
``Held`` says what the running jobs keep of it: the blocks left on the GPUs no running
job holds, and what each running job's GPUs add back when it leaves them. See
``build.py`` for how the node-shape rows use both.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from itertools import chain
from operator import itemgetter
from typing import Any, Callable, cast

import numpy as np

from engine.core.context import JobView, RoundContext
from estimators.base import EstimatesInBulk, LearnsOnline, throughputs
from instances.cluster import ClusterSpec
from instances.grid import Grid
from instances.jobs import Job


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
    def from_cluster(cls, cluster: ClusterSpec, without: frozenset[int] = frozenset()) -> "Capacity":
        """The cluster's capacity, less the nodes in ``without`` (drained or down): their
        blocks are gone, the levels (the node sizes the hardware has) stay, so a shape
        wider than every node left has a row that holds it at zero. (Memoized: specs
        are frozen values.)"""
        return _capacity(cluster, frozenset(without))

    @classmethod
    def _from_cluster(cls, cluster: ClusterSpec, without: frozenset[int]) -> "Capacity":
        sizes: dict[str, list[int]] = {}
        for g in cluster.groups:
            sizes.setdefault(g.gpu_type, []).extend([g.gpus_per_node] * g.num_nodes)
        full = cls.from_node_sizes(sizes)
        if not without:
            return full
        left: dict[str, list[int]] = {t: [] for t in full.types}
        for n in cluster.nodes():
            if n.node_id not in without:
                left[n.gpu_type].append(n.num_gpus)
        blocks = tuple(tuple(sum(s // lv for s in left[t]) for lv in levels)
                       for t, levels in zip(full.types, full.levels))
        return cls(full.types, full.levels, blocks, full.max_gpus_per_node)

    def total(self, type_index: int) -> int:
        return self.blocks[type_index][0]


@dataclass(frozen=True, eq=False)
class Held:
    """What the running jobs hold of a round's ``Capacity`` (``build.py``'s node-shape rows).

    - ``free_blocks[t][l]``: per GPU type and level (``Capacity.levels``), the l-GPU blocks
      on the GPUs no running job holds, on the nodes in service: sum over nodes of
      floor(free GPUs / l);
    - ``gain[j, l]``: per job (the round's job order) and level of its GPU type, the blocks
      that job's GPUs add when it leaves them (0 for a queued job). On each node the
      first running job (in job order) is credited with its GPUs together with the node's
      free ones, floor((free + held) / l) - floor(free / l); every other job on the node
      with floor(held / l). Summed over any set of jobs that leave, this never exceeds
      the blocks they really free (floor is superadditive), so a decision the rows admit
      with those jobs leaving has the blocks it counts;
    - ``job_type[j]``: the GPU type index the job holds GPUs of (-1: none in service, or
      GPUs of no single type: its current column is then priced as a new one).
    """
    free_blocks: tuple[tuple[int, ...], ...]
    gain: np.ndarray
    job_type: np.ndarray

    def key(self) -> tuple:
        """What the rows read of it (``RowsMemo``)."""
        return (self.free_blocks, self.gain, self.job_type)


def held_capacity(cap: Capacity, cluster: ClusterSpec, unavailable: frozenset[int], current: list) -> Held:
    """``Held`` for the jobs whose allocations are ``current`` (one per job in the round's
    order, None for a queued job)."""
    nodes = cluster.nodes()
    type_index = {t: i for i, t in enumerate(cap.types)}
    size = np.array([0 if n.node_id in unavailable else n.num_gpus for n in nodes], dtype=np.int64)
    node_type = np.array([type_index.get(n.gpu_type, -1) for n in nodes], dtype=np.int64)
    on = [None if a is None else [(n, c) for n, _, c in (a.node_masks or ())
                                  if 0 <= n < len(nodes) and n not in unavailable] for a in current]
    return held_on_nodes(cap, node_type, size, on)


def held_on_nodes(cap: Capacity, node_type: np.ndarray, size: np.ndarray,
                  on: list[list[tuple[int, int]] | None]) -> Held:
    """``Held`` from the nodes' GPU type indices and sizes (0: out of service) and, per job,
    the (node, GPUs) it holds (None: queued)."""
    free = size.copy()
    for nodes in on:
        for n, c in nodes or ():
            free[n] -= c
    free = np.maximum(free, 0)
    width = max((len(lv) for lv in cap.levels), default=0)
    gain = np.zeros((len(on), width), dtype=np.int64)
    job_type = np.full(len(on), -1, dtype=np.int64)
    credited: set[int] = set()
    for j, nodes in enumerate(on):
        if not nodes:
            continue
        types = {int(node_type[n]) for n, _ in nodes}
        if len(types) != 1 or -1 in types:
            continue
        t = types.pop()
        job_type[j] = t
        for li, lvl in enumerate(cap.levels[t]):
            g = 0
            for n, c in nodes:
                if n in credited:
                    g += c // lvl
                else:
                    f = int(free[n])
                    g += (f + c) // lvl - f // lvl
            gain[j, li] = g
        credited.update(n for n, _ in nodes)
    blocks = []
    for ti, levels in enumerate(cap.levels):
        f = free[node_type == ti]
        blocks.append(tuple(int(np.sum(f // lvl)) for lvl in levels))
    gain.setflags(write=False)
    job_type.setflags(write=False)
    return Held(tuple(blocks), gain, job_type)


@lru_cache(maxsize=64)
def _capacity(cluster: ClusterSpec, without: frozenset[int]) -> Capacity:
    return Capacity._from_cluster(cluster, without)


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


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
    resume_s: np.ndarray | None = None           # per job: a running job's resume downtime if stopped now
    held: Held | None = None                     # what running jobs hold (None: rows over the whole capacity)

    @property
    def n_jobs(self) -> int:
        return len(self.job_ids)

    @property
    def n_cols(self) -> int:
        return len(self.col_job)

    # Derived arrays, computed once per round (every objective term and the incremental
    # search read them; a round's arrays are not changed after it is built) and read-only,
    # so that no reader can change what the others see.
    @cached_property
    def col_gpus(self) -> np.ndarray:
        return _frozen(self.col_nodes * self.col_gpn)

    @cached_property
    def speedup(self) -> np.ndarray:
        """Per column: estimated throughput over the job's reference throughput."""
        return _frozen(self.col_throughput / self.ref_throughput[self.col_job])

    @cached_property
    def remaining_time_ref_s(self) -> np.ndarray:
        """Per job: time to finish at the reference throughput."""
        return _frozen(self.remaining_iterations * self.global_batch / self.ref_throughput)

    def current_among(self, columns: np.ndarray) -> np.ndarray:
        """Per job, the position of its current column among ``columns`` (sorted,
        distinct column indices), -1 for a job that holds none; every running job's
        current column must be among them."""
        cols = np.asarray(columns, dtype=np.int64)
        if len(cols) and (np.any(np.diff(cols) <= 0) or cols[0] < 0 or cols[-1] >= self.n_cols):
            raise ValueError("columns must be sorted, distinct column indices")
        cur = self.current_col
        run = cur >= 0
        pos = np.minimum(np.searchsorted(cols, np.maximum(cur, 0)), max(len(cols) - 1, 0))
        if run.any() and (not len(cols) or np.any(cols[pos[run]] != cur[run])):
            raise ValueError("a running job's current column is not among the columns")
        return np.where(run, pos, -1)

    def restricted(self, columns: np.ndarray) -> RoundData:
        """The same round with only ``columns`` (sorted, distinct column indices): every
        job kept, the per-column arrays cut to those columns, ``current_col`` renumbered.
        Every running job's current column must be among them. A columnwise objective
        (``engine/decide/objectives/base.py``) applied to it gives the full model restricted to
        those columns."""
        cols = np.asarray(columns, dtype=np.int64)
        current = self.current_among(cols)

        def cut(t: tuple) -> tuple:               # grids, plans: empty in synthetic rounds
            if not t or not len(cols):
                return ()
            got = itemgetter(*cols.tolist())(t)
            return got if len(cols) > 1 else (got,)

        return replace(self, current_col=current, col_job=self.col_job[cols],
                       col_type=self.col_type[cols], col_nodes=self.col_nodes[cols], col_gpn=self.col_gpn[cols],
                       col_pp=self.col_pp[cols], col_throughput=self.col_throughput[cols],
                       col_reconfig_s=self.col_reconfig_s[cols],
                       grids=cut(self.grids), plans=cut(self.plans))

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
    return float(ctx.reconfig.cost_to_grid_s(view.job, view.current, grid, resumed=_resumed(view)))


def _resume_cost_s(ctx: RoundContext, view: JobView) -> float:
    if ctx.reconfig is None or view.current is None:
        return 0.0
    return float(ctx.reconfig.cost_to_grid_s(view.job, None, view.current.grid, resumed=True))


def _resumed(view: JobView) -> bool:
    """A queued job that ran before (its state is in storage)."""
    return view.current is None and view.attained_gpu_s > 0


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


@dataclass
class _Block:
    """One job's candidate columns (best depth per shape, in shape order), independent of
    the round, as the arrays the round data concatenates."""
    grids: tuple
    plans: tuple
    col_type: np.ndarray
    col_nodes: np.ndarray
    col_gpn: np.ndarray
    col_pp: np.ndarray
    col_throughput: np.ndarray
    col_reconfig_s: np.ndarray
    current: int                    # index of the current grid in the block, -1 if none
    ref_throughput: float
    resume_s: float = 0.0           # a running job: what resuming would cost if it were stopped now


@dataclass
class _Candidates:
    """One job's candidate grids (for its known infeasible shapes), before estimates:
    enumerated, filtered and grouped by shape (in shape order). The same whatever grid the
    job holds, so a move does not enumerate them again."""
    grids: tuple                    # a tuple: bulk estimators may know it by identity
    group: np.ndarray               # per grid: the index of its shape in ``keys``
    keys: list                      # (GPU type, nodes, GPUs per node), sorted
    col_type: np.ndarray            # per grid, as the block's arrays
    col_nodes: np.ndarray
    col_gpn: np.ndarray
    col_pp: np.ndarray
    index: dict                     # grid -> its first index in ``grids``


@dataclass
class _Layout:
    """One job's candidates in one state (current grid, resumed or not), priced as moves."""
    cand: _Candidates
    col_reconfig_s: np.ndarray      # nan until priced (only the grids a block keeps are)
    current: int                    # index of the current grid, -1 if none
    resume_s: float


class RoundDataCache:
    """What ``build_round_data`` may reuse from round to round, for one performance model.

    - each job's candidate grids (``_Candidates``) by (job id, known infeasible shapes):
      enumeration and filter run only when one of those changes. Grid filters must
      therefore be functions of the job, the grid and the job's known infeasible shapes
      (every registered policy's are), not of what the job holds;
    - their move prices (``_Layout``) by (job id, current grid, resumed or not, known
      infeasible shapes);
    - a job's estimates on its candidates by the candidates' key and the model's
      ``estimate_key`` for the job;
    - estimates by (model, global batch, grid), for performance models that estimate grid
      by grid: they depend on the job only through those — except for a job a model
      that learns online (``estimators.LearnsOnline``) has measurements of, whose
      estimates are its own and live only in its block;
    - each job's column block by the layout's key and the model's ``estimate_key`` for
      the job where it learns online: estimates and the best depth per shape are
      recomputed only when one of those changes.

    A new performance model (``perf`` is not the one cached for, as in a new simulation)
    empties them all; a new ``shared_key()`` of one that learns online across jobs
    (another job's run was established) the estimates and blocks; a new move cost model
    the layouts and blocks.
    """

    def __init__(self) -> None:
        self.estimates: dict = {}
        self.job_estimates: dict = {}
        self.blocks: dict = {}
        self.layouts: dict = {}
        self.candidates: dict = {}
        self._columns: tuple[list, dict] = ([], _columns([]))       # the last round's blocks, joined
        self._owner: object = None
        self._reconfig: object = None
        self._shared: object = None
        self.learns = False             # the bound model learns online (``LearnsOnline``)
        self.bulk = False               # ... and estimates in bulk (``EstimatesInBulk``)

    def bind(self, perf: Any, reconfig: object, active_jobs: int) -> None:
        if perf is not self._owner:     # protocol checks are slow: once per model, not per round
            self.learns, self.bulk = isinstance(perf, LearnsOnline), isinstance(perf, EstimatesInBulk)
            self.layouts, self.candidates = {}, {}
        shared = perf.shared_key() if self.learns else None
        if perf is not self._owner or shared != self._shared:
            self.estimates, self.job_estimates, self.blocks, self._owner, self._shared = {}, {}, {}, perf, shared
        if reconfig is not self._reconfig:
            self.blocks, self.layouts, self._reconfig = {}, {}, reconfig
        bound = 4 * active_jobs + 1000                    # bounded: drop entries of ended jobs
        for name in ("blocks", "layouts", "candidates", "job_estimates"):
            if len(getattr(self, name)) > bound:
                setattr(self, name, {})

    def columns_of(self, blocks: list[_Block]) -> dict:
        """``_columns(blocks)``, reused when the blocks are the last round's, one by one
        (the usual round: no job moved, arrived, ended or was estimated anew)."""
        last, cols = self._columns
        if len(last) != len(blocks) or not all(map(operator.is_, last, blocks)):
            cols = _columns(blocks)
            self._columns = (blocks, cols)
        return cols


def _candidates(ctx: RoundContext, view: JobView, cap: Capacity, type_index: dict, grids_fn: GridsFn,
                max_gpus: int, grid_filter) -> _Candidates:
    grids = []
    for grid in grids_fn(view.job, ctx.cluster, max_gpus=max_gpus):
        t = grid.gpu_type
        if t not in type_index or grid.shape.gpus_per_node > cap.max_gpus_per_node[type_index[t]]:
            continue
        if grid_filter is not None and not grid_filter(view, grid):
            continue
        grids.append(grid)
    skeys = [(g.gpu_type, g.shape.num_nodes, g.shape.gpus_per_node) for g in grids]
    keys = sorted(set(skeys))
    position = {k: i for i, k in enumerate(keys)}
    index: dict = {}
    for i, g in enumerate(grids):
        index.setdefault(g, i)
    return _Candidates(tuple(grids), np.array([position[k] for k in skeys], dtype=np.int64), keys,
                       np.array([type_index[t] for t, _, _ in skeys], dtype=np.int64),
                       np.array([n for _, n, _ in skeys], dtype=np.int64),
                       np.array([m for _, _, m in skeys], dtype=np.int64),
                       np.array([g.pp for g in grids], dtype=np.int64), index)


def _layout(ctx: RoundContext, view: JobView, cand: _Candidates) -> _Layout:
    cur_grid = view.current.grid if view.current is not None else None
    return _Layout(cand, np.full(len(cand.grids), np.nan), cand.index.get(cur_grid, -1) if cur_grid is not None else -1,
                   _resume_cost_s(ctx, view))


def _block(ctx: RoundContext, view: JobView, lay: _Layout, thr: list[float], plans: list) -> _Block | None:
    """The best depth per shape (the current grid for the current shape; else the first
    grid of the highest estimated throughput), among grids with a positive finite one."""
    t = np.asarray(thr, dtype=float)
    valid = (t > 0) & np.isfinite(t)
    if not valid.any():
        return None
    cand = lay.cand
    rank = np.where(valid, t, -np.inf)
    if lay.current >= 0 and valid[lay.current]:
        rank[lay.current] = np.inf
    order = np.lexsort((np.arange(len(t)), -rank, cand.group))     # by shape, best first, then enumeration
    g = cand.group[order]
    first = order[np.concatenate(([True], g[1:] != g[:-1]))]
    win = first[valid[first]]
    for i in win[np.isnan(lay.col_reconfig_s[win])].tolist():
        lay.col_reconfig_s[i] = _reconfig_cost_s(ctx, view, cand.grids[i])
    wins, t_win = win.tolist(), t[win]          # Python ints and floats: cheaper to index and key with
    thr_of = dict(zip(map(cand.keys.__getitem__, cand.group[win].tolist()), t_win.tolist()))
    current = wins.index(lay.current) if lay.current >= 0 and valid[lay.current] else -1
    return _Block(tuple(map(cand.grids.__getitem__, wins)), tuple(map(plans.__getitem__, wins)), cand.col_type[win],
                  cand.col_nodes[win], cand.col_gpn[win], cand.col_pp[win], t_win, lay.col_reconfig_s[win], current,
                  _reference_throughput(view.job, thr_of), lay.resume_s)


def build_round_data(ctx: RoundContext, perf, *, grids_fn: GridsFn | None = None,
                     max_gpus: int = 16, grid_filter: Callable[[Any, Grid], bool] | None = None,
                     cache: RoundDataCache | None = None, held: bool = True) -> RoundData:
    """Enumerate candidate grids for every job in ``ctx``, estimate them with ``perf``
    and keep the best pipeline depth per shape; ``held``: with what running jobs hold on
    each node (``RoundData.held``; False: none, the node-shape rows over the whole
    capacity).

    ``grid_filter(job_view, grid)`` drops candidates (baselines that keep the user's
    GPU count). ``cache`` (a ``RoundDataCache`` kept by the policy) reuses estimates and
    unchanged jobs' columns across rounds; the result is the same with or without it.
    """
    grids_fn = grids_fn or default_grids_fn()
    cap = Capacity.from_cluster(ctx.cluster, ctx.unavailable_nodes)
    type_index = {t: i for i, t in enumerate(cap.types)}
    if cache is None:
        cache = RoundDataCache()
    cache.bind(perf, ctx.reconfig, len(ctx.jobs))
    learns, bulk = cache.learns, cache.bulk

    job_ids, rem, gb, cur_col, running, queued, deadline, prio, tenants, req_g, req_t = ([] for _ in range(11))
    attained, arrival = [], []
    jobs = []
    current: list = []
    blocks: list[_Block] = []
    ref = []
    unschedulable = []
    n_cols = 0
    keyed = []
    for view in ctx.jobs:
        job = view.job
        # what the job's own estimates depend on beyond its model and batch (a model that
        # learns online and has measurements of it: its estimate_key, new with each one)
        version = perf.estimate_key(job) if learns else None
        ckey = (job.job_id, view.known_infeasible_shapes)
        lkey = (ckey, view.current.grid if view.current is not None else None, _resumed(view))
        keyed.append((view, job, version, ckey, lkey, (lkey, version)))
    if bulk:        # the jobs with estimates of their own to make this round, told in one go
        cast(EstimatesInBulk, perf).prepare([
            job for _, job, version, ckey, _, bkey in keyed
            if version is not None and bkey not in cache.blocks and (ckey, version) not in cache.job_estimates])
    for view, job, version, ckey, lkey, bkey in keyed:
        if bkey in cache.blocks:
            block = cache.blocks[bkey]
        else:
            lay = cache.layouts.get(lkey)
            if lay is None:
                cand = cache.candidates.get(ckey)
                if cand is None:
                    cand = cache.candidates[ckey] = _candidates(ctx, view, cap, type_index, grids_fn, max_gpus,
                                                                grid_filter)
                lay = cache.layouts[lkey] = _layout(ctx, view, cand)
            est = cache.job_estimates.get((ckey, version))
            if est is None:
                # a job with its own estimates does not share (nor fill) the per-model memo
                est = cache.job_estimates[(ckey, version)] = throughputs(
                    perf, job, lay.cand.grids, cache.estimates if version is None else {}, bulk)
            block = cache.blocks[bkey] = _block(ctx, view, lay, *est)
        if block is None:
            unschedulable.append(job.job_id)
            continue
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
        cur_col.append(n_cols + block.current if block.current >= 0 else -1)
        current.append(view.current)
        n_cols += len(block.grids)
        blocks.append(block)
        ref.append(block.ref_throughput)

    cols = cache.columns_of(blocks)
    return RoundData(
        now_s=float(ctx.now_s), round_interval_s=float(ctx.round_interval_s), capacity=cap,
        job_ids=tuple(job_ids), remaining_iterations=np.array(rem), ref_throughput=np.array(ref),
        global_batch=np.array(gb), current_col=np.array(cur_col, dtype=np.int64),
        running=np.array(running, dtype=bool), queued_s=np.array(queued), deadline_s=np.array(deadline),
        priority=np.array(prio), tenants=tuple(tenants), requested_gpus=np.array(req_g, dtype=np.int64),
        requested_type=tuple(req_t), unschedulable=tuple(unschedulable), jobs=tuple(jobs),
        attained_gpu_s=np.array(attained), arrival_s=np.array(arrival),
        held=held_capacity(cap, ctx.cluster, ctx.unavailable_nodes, current) if held else None, **cols)


def _columns(blocks: list[_Block]) -> dict:
    """The round's per-column fields (and the blocks' resume costs), joined from ``blocks``
    in order; read-only, since a round with the same blocks reuses them."""
    def cat(field: str, dtype) -> np.ndarray:
        return np.concatenate([getattr(b, field) for b in blocks]) if blocks else np.zeros(0, dtype=dtype)
    arrays = dict(
        col_job=np.repeat(np.arange(len(blocks), dtype=np.int64), [len(b.grids) for b in blocks]),
        col_type=cat("col_type", np.int64), col_nodes=cat("col_nodes", np.int64), col_gpn=cat("col_gpn", np.int64),
        col_pp=cat("col_pp", np.int64), col_throughput=cat("col_throughput", float),
        col_reconfig_s=cat("col_reconfig_s", float), resume_s=np.array([b.resume_s for b in blocks], dtype=float))
    return {**{k: _frozen(v) for k, v in arrays.items()}, "grids": tuple(chain.from_iterable(b.grids for b in blocks)),
            "plans": tuple(chain.from_iterable(b.plans for b in blocks))}


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


def keep_columns(data: RoundData, keep: np.ndarray) -> RoundData:
    """``data`` with only the columns where ``keep`` is True (every job keeps its row;
    current columns that are dropped become -1)."""
    import dataclasses
    keep = np.asarray(keep, dtype=bool)
    if keep.all():
        return data
    new_index = np.cumsum(keep) - 1
    cur = np.where((data.current_col >= 0) & keep[np.maximum(data.current_col, 0)],
                   new_index[np.maximum(data.current_col, 0)], -1)
    idx = np.flatnonzero(keep).tolist()
    pick = itemgetter(*idx) if len(idx) > 1 else (lambda t: tuple(t[k] for k in idx))
    return dataclasses.replace(
        data, current_col=cur.astype(np.int64), col_job=data.col_job[keep], col_type=data.col_type[keep],
        col_nodes=data.col_nodes[keep], col_gpn=data.col_gpn[keep], col_pp=data.col_pp[keep],
        col_throughput=data.col_throughput[keep], col_reconfig_s=data.col_reconfig_s[keep],
        grids=pick(data.grids) if data.grids else (), plans=pick(data.plans) if data.plans else ())


def freeze_jobs(data: RoundData, frozen: frozenset[str]) -> RoundData:
    """``data`` where each running job in ``frozen`` has only its current column (the
    caller also pins it, so it keeps that column)."""
    if not frozen:
        return data
    is_frozen = np.array([jid in frozen for jid in data.job_ids], dtype=bool)
    cols = np.arange(data.n_cols)
    own = data.current_col[data.col_job]
    keep = ~is_frozen[data.col_job] | (own < 0) | (own == cols)
    return keep_columns(data, keep)


def best_plan_per_count(data: RoundData) -> RoundData:
    """``data`` keeping, per job and (GPU type, GPU count), only the column with the best
    estimated throughput (its current column where it runs on that type and count): the
    planner's best node shape and pipeline depth for the count and type a policy picks,
    which is how the ``-ap`` baselines run (adaptive parallelism without co-designing the
    placement)."""
    best: dict[tuple, int] = {}
    gpus = data.col_gpus
    cur = data.current_col
    for k in range(data.n_cols):
        j = int(data.col_job[k])
        key = (j, int(data.col_type[k]), int(gpus[k]))
        b = best.get(key)
        if b is None or (b != cur[j] and (k == cur[j] or data.col_throughput[k] > data.col_throughput[b])):
            best[key] = k
    keep = np.zeros(data.n_cols, dtype=bool)
    keep[list(best.values())] = True
    return keep_columns(data, keep)
