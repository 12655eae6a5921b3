"""Plans inside one grid: the cheap proxy plan and an exhaustive search to check it.

Proxy plan (what the scheduler sees for a grid):
1. stage split: contiguous layers -> ``pp`` stages minimising the largest stage's load,
   where a layer's load is its forward + backward time on that GPU type at micro-batch 1
   (exact dynamic programme over prefix sums);
2. per-stage shape: tensor-parallel degrees that keep a tensor group inside one node
   (``PlannerConfig.tp_within_node_only``) are composed and the fastest that fits memory
   is kept (at most log2(GPUs per node) + 1 compositions); a degree that does not fit
   with the time-balanced split tries ``Planner.fallback_splits`` (memory-balanced split,
   the split half-way, single-boundary moves; bounded) and keeps the first that fits;
3. micro-batches: pp = 1: 1 (more only when memory needs gradient accumulation);
   pp > 1: the power of two m0 >= ``proxy_microbatches_per_stage`` x pp and the next
   ``proxy_microbatch_candidates - 1`` doublings, capped by the per-replica batch; each
   doubled until the plan fits. Schedule: 1F1B. Tensor groups that cross nodes are tried
   only when no in-node shape fits with any of those splits. ``dp_only`` (pure data
   parallelism) replicates MoE experts (ep = 1).

Data-parallel rule (both searches, and ``grids.candidate_grids``): a plan's
data-parallel degree never exceeds the global batch (every replica gets at least one
sample per step), so a tensor degree is offered only when ``stage GPUs / tp <= batch``;
a grid with no such degree has no plan.

Exhaustive search: every stage split (all compositions when there are at most
``max_exhaustive_splits``; otherwise the balanced split and every single-boundary move by
up to ``split_perturbation`` layers), every tensor degree dividing the stage (also across
nodes), every power-of-two micro-batch count up to ``max_microbatches`` and the
per-replica batch, both schedules. It returns the best feasible plan, so the proxy can
be compared with the grid's true best under the same cost model.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from instances.arch import ModelArch
from instances.gpus import GpuType, get_gpu
from instances.grid import Grid, Shape, pow2_upto
from instances.models import get_model

from .base import Plan
from .compose import Breakdown, StageTable, micro_batch_size
from .config import EstimatorConfig
from .layers import expert_parallel_degree, layer_costs, max_useful_tp
from .memory import MemoryBreakdown, MemoryTable
from .timing import CatalogComm, RooflineTimer


@dataclass(frozen=True)
class PlanResult:
    plan: Plan
    breakdown: Breakdown
    memory: MemoryBreakdown
    feasible: bool
    evaluated: int = 1                 # plans composed to find it

    @property
    def iteration_time_s(self) -> float:
        return self.breakdown.iteration_time_s


def minmax_split(n: int, parts: int, cost) -> tuple[int, ...]:
    """Contiguous split of n layers into ``parts`` non-empty stages minimising the largest
    ``cost(stage, first, end)`` (ties: the earliest boundaries). Exact DP, O(parts * n^2)."""
    if not 1 <= parts <= n:
        raise ValueError(f"cannot split {n} layers into {parts} stages")
    INF = float("inf")
    best = [[INF] * (n + 1) for _ in range(parts + 1)]
    arg = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for j in range(k, n - (parts - k) + 1):
            bj, aj = INF, k - 1
            for i in range(k - 1, j):
                v = max(best[k - 1][i], cost(k - 1, i, j))
                if v < bj * (1 - 1e-12):
                    bj, aj = v, i
            best[k][j], arg[k][j] = bj, aj
    sizes, j = [], n
    for k in range(parts, 0, -1):
        i = arg[k][j]
        sizes.append(j - i)
        j = i
    return tuple(reversed(sizes))


def balanced_split(loads: list[float] | tuple[float, ...], parts: int) -> tuple[int, ...]:
    """Contiguous split of ``loads`` into ``parts`` non-empty groups minimising the largest
    group sum (ties: the earliest boundaries)."""
    pre = [0.0]
    for x in loads:
        pre.append(pre[-1] + x)
    return minmax_split(len(loads), parts, lambda k, i, j: pre[j] - pre[i])


def enumerate_splits(n: int, parts: int, base: tuple[int, ...], limit: int, perturb: int):
    """All compositions of n into ``parts`` when at most ``limit``; else ``base`` and its
    single-boundary moves by up to +-``perturb``."""
    if math.comb(n - 1, parts - 1) <= limit:
        for cuts in itertools.combinations(range(1, n), parts - 1):
            edges = (0,) + cuts + (n,)
            yield tuple(edges[i + 1] - edges[i] for i in range(parts))
        return
    yield base
    bounds = list(itertools.accumulate(base))[:-1]
    for k in range(len(bounds)):
        for d in range(-perturb, perturb + 1):
            if d == 0:
                continue
            nb = list(bounds)
            nb[k] += d
            edges = [0] + nb + [n]
            sizes = tuple(edges[i + 1] - edges[i] for i in range(parts))
            if min(sizes) >= 1:
                yield sizes


@dataclass
class Planner:
    """Proxy and exhaustive planning with one timer/comm model and config. Caches its
    per-(model, GPU, shape) tables; not shared across threads."""
    cfg: EstimatorConfig = field(default_factory=EstimatorConfig)
    timer: object = None
    comm: object = None

    def __post_init__(self):
        self.timer = self.timer or RooflineTimer(self.cfg.efficiency)
        self.comm = self.comm or CatalogComm(self.cfg.efficiency)
        self._tables: dict = {}
        self._mem: dict = {}
        self._splits: dict = {}
        self._msplits: dict = {}
        self._fsplits: dict = {}
        self.fits_cache: dict = {}            # grids.grid_fits results
        self.grids_cache: dict = {}           # grids.candidate_grids results

    # -- building blocks -------------------------------------------------------------
    def table(self, arch: ModelArch, mb: int, tp: int, dp: int, gpu: GpuType, gpn: int,
              link_load: float, ep: int = 0) -> StageTable:
        ep = ep or self.auto_ep(arch, dp, tp, gpn)
        key = (arch, mb, tp, dp, gpu.name, gpn, link_load, ep)
        t = self._tables.get(key)
        if t is None:
            t = StageTable(arch, micro_batch=mb, tp=tp, dp=dp, gpu=gpu, gpus_per_node=gpn, timer=self.timer,
                           comm=self.comm, eff=self.cfg.efficiency, link_load=link_load, ep=ep)
            self._tables[key] = t
        return t

    def accumulates(self, dp_only: bool) -> bool:
        """Whether a plan may accumulate gradients over micro-batches (``PlannerConfig.
        dp_only_grad_accumulation`` restricts pure data-parallel plans to one)."""
        return self.cfg.planner.dp_only_grad_accumulation or not dp_only

    @staticmethod
    def auto_ep(arch: ModelArch, dp: int, tp: int, gpn: int | None) -> int:
        """Default expert-parallel degree: data-parallel ranks inside one node."""
        return expert_parallel_degree(arch, dp, None if gpn is None else max(1, gpn // tp))

    def ep_options(self, arch: ModelArch, dp: int, tp: int, gpn: int) -> list[int]:
        """Inside a node first; across nodes (less memory, all-to-alls on the network) second."""
        return sorted({self.auto_ep(arch, dp, tp, gpn), expert_parallel_degree(arch, dp)})

    def memtable(self, arch: ModelArch, mb: int, tp: int, dp: int = 1, gpn: int | None = None,
                 ep: int = 0) -> MemoryTable:
        ep = ep or self.auto_ep(arch, dp, tp, gpn)
        key = (arch, mb, tp, ep, dp if self.cfg.efficiency.dp_sharded_optimizer else 1)
        t = self._mem.get(key)
        if t is None:
            costs = layer_costs(arch, micro_batch=mb, tp=tp, backward_ratio=self.cfg.efficiency.backward_flops_ratio)
            t = MemoryTable(arch, costs, tp, self.cfg.memory, self.cfg.efficiency, ep, key[-1])
            self._mem[key] = t
        return t

    def layer_loads(self, arch: ModelArch, gpu: GpuType) -> list[float]:
        """Per-layer forward + backward time at micro-batch 1, tp = 1 (the split's load)."""
        t = self.table(arch, 1, 1, 1, gpu, 1, 0.0)
        return [(t.pf[i + 1] - t.pf[i]) + (t.pb[i + 1] - t.pb[i]) for i in range(len(t.costs))]

    def split(self, arch: ModelArch, gpu: GpuType, pp: int) -> tuple[int, ...]:
        key = (arch, gpu.name, pp)
        s = self._splits.get(key)
        if s is None:
            s = balanced_split(self.layer_loads(arch, gpu), pp)
            self._splits[key] = s
        return s

    def memory_split(self, arch: ModelArch, global_batch: int, grid: Grid) -> tuple[int, ...]:
        """Split minimising the largest stage's peak memory under 1F1B (stage k keeps
        pp - k micro-batches in flight) at the most micro-batches the config allows, tp = 1."""
        key = (arch, global_batch, grid.num_gpus, grid.pp)
        if key in self._msplits:
            return self._msplits[key]
        pp = grid.pp
        dp = max(1, grid.num_gpus // pp)
        per_replica = max(1, math.ceil(global_batch / dp))
        m = min(per_replica, self.cfg.planner.max_microbatches)
        t = self.memtable(arch, micro_batch_size(global_batch, dp, m), 1, dp, grid.shape.gpus_per_node,
                          expert_parallel_degree(arch, dp))
        s = minmax_split(len(t.costs), pp, lambda k, i, j: (t.ps[j] - t.ps[i]) + (t.pa[j] - t.pa[i]) * min(m, pp - k))
        self._msplits[key] = s
        return s

    def evaluate(self, arch: ModelArch, plan: Plan, *, global_batch: int, gpu: GpuType, gpus_per_node: int,
                 link_load: float = 0.0) -> PlanResult:
        mb = micro_batch_size(global_batch, plan.dp, plan.microbatches)
        bd = self.table(arch, mb, plan.tp, plan.dp, gpu, gpus_per_node, link_load, plan.ep).breakdown(
            plan.stage_layers, plan.microbatches, plan.schedule)
        mem = self.memtable(arch, mb, plan.tp, plan.dp, gpus_per_node, plan.ep).breakdown(
            plan.stage_layers, plan.microbatches, plan.schedule)
        return PlanResult(plan, bd, mem, mem.fits(gpu, self.cfg.memory))

    def tp_options(self, arch: ModelArch, grid: Grid, *, within_node: bool, dp_only: bool,
                   global_batch: int | None = None) -> list[int]:
        """Tensor degrees of a grid's stages; with ``global_batch``, only those whose
        data-parallel degree (stage GPUs / tp) is at most the batch (module doc)."""
        stage = grid.num_gpus // grid.pp
        if dp_only:
            return [1] if global_batch is None or stage <= global_batch else []
        cap = min(self.cfg.planner.max_tp, max_useful_tp(arch))
        out = []
        for d in range(1, min(stage, cap) + 1):
            if stage % d or (global_batch is not None and stage // d > global_batch):
                continue
            if within_node and (d > grid.shape.gpus_per_node or grid.shape.gpus_per_node % d):
                continue
            out.append(d)
        return out

    def fallback_splits(self, arch: ModelArch, global_batch: int, grid: Grid,
                        split: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Stage splits the proxy tries when a shape does not fit with the time-balanced
        ``split``: the memory-balanced split, the split half-way between the two (boundaries
        averaged), and every single-boundary move of ``split`` by up to
        ``split_perturbation`` layers; without duplicates or ``split``, ordered by their
        largest stage's compute load (the quantity ``split`` minimises), so that the first
        one that fits is the one closest to time-balanced. At most
        2 + 2 x perturbation x (pp - 1) splits."""
        key = (arch, global_batch, grid, split)
        cached = self._fsplits.get(key)
        if cached is not None:
            return cached
        n = sum(split)
        msplit = self.memory_split(arch, global_batch, grid)
        bt = list(itertools.accumulate(split))[:-1]
        bm = list(itertools.accumulate(msplit))[:-1]
        edges = [0] + [(x + y) // 2 for x, y in zip(bt, bm)] + [n]
        mid = tuple(edges[i + 1] - edges[i] for i in range(len(split)))
        cands = [msplit] + ([mid] if min(mid) >= 1 else [])
        cands += list(enumerate_splits(n, len(split), split, 0, self.cfg.planner.split_perturbation))
        loads = self.layer_loads(arch, get_gpu(grid.gpu_type))
        pre = [0.0] + list(itertools.accumulate(loads))

        def bottleneck(sp):
            ends = list(itertools.accumulate(sp))
            return max(pre[e] - pre[e - k] for e, k in zip(ends, sp))

        out = sorted(set(cands) - {split}, key=lambda sp: (bottleneck(sp), sp))
        self._fsplits[key] = out
        return out

    # -- the proxy plan --------------------------------------------------------------
    def proxy(self, arch: ModelArch, global_batch: int, grid: Grid, *, link_load: float = 0.0,
              dp_only: bool = False) -> PlanResult | None:
        """The proxy plan of ``grid`` (None when the grid has no valid plan at all)."""
        pp = grid.pp
        if pp > len(arch.layers()) or (dp_only and pp > 1):
            return None
        gpu = get_gpu(grid.gpu_type)
        gpn = grid.shape.gpus_per_node
        split = self.split(arch, gpu, pp)
        pc = self.cfg.planner
        options = self.tp_options(arch, grid, within_node=pc.tp_within_node_only, dp_only=dp_only,
                                  global_batch=global_batch)
        wider = [t for t in self.tp_options(arch, grid, within_node=False, dp_only=dp_only,
                                            global_batch=global_batch) if t not in options]
        state = {"best": None, "fallback": None, "n": 0}

        def try_shape(split, tp, first_start_only=False) -> bool:
            dp = grid.num_gpus // pp // tp
            per_replica = max(1, math.ceil(global_batch / dp))
            cap = min(per_replica, pc.max_microbatches) if self.accumulates(dp_only) else 1
            if pp == 1:
                starts = [1]
            else:
                m0 = 1
                while m0 < pc.proxy_microbatches_per_stage * pp and m0 * 2 <= cap:
                    m0 *= 2
                starts = [m0 * 2 ** k for k in range(pc.proxy_microbatch_candidates) if m0 * 2 ** k <= cap]
                if first_start_only:          # fallback splits: one count, doubled until it fits
                    starts = starts[:1]
            fits = False
            eps = [1] if dp_only else self.ep_options(arch, dp, tp, gpn)   # pure DP replicates experts
            for m0 in starts:
                for ep in eps:           # experts across nodes only when inside a node does not fit
                    m = m0
                    while True:
                        r = self.evaluate(arch, Plan(pp, dp, tp, split, m, "1f1b", ep), global_batch=global_batch,
                                          gpu=gpu, gpus_per_node=gpn, link_load=link_load)
                        state["n"] += 1
                        if r.feasible or m * 2 > cap:
                            break
                        m *= 2
                    if r.feasible:
                        break
                b, f = state["best"], state["fallback"]
                if r.feasible and (b is None or r.iteration_time_s < b.iteration_time_s):
                    state["best"] = r
                if f is None or r.memory.peak_bytes < f.memory.peak_bytes:
                    state["fallback"] = r
                fits = fits or r.feasible
            return fits

        for tps in (options, wider):      # cross-node tensor groups only when nothing else fits
            if not tps:
                continue
            for tp in tps:
                if not try_shape(split, tp) and pp > 1:
                    # this shape does not fit with the time-balanced split: other splits
                    for sp in self.fallback_splits(arch, global_batch, grid, split):
                        if try_shape(sp, tp, True):   # the first split that fits, in fallback_splits' order
                            break
            if state["best"] is not None:
                break
        best, fallback, n = state["best"], state["fallback"], state["n"]
        chosen = best or fallback
        if chosen is None:
            return None
        feasible = chosen.feasible
        if feasible and not dp_only and self.cfg.memory.grid_margin != 1.0:
            feasible = shape_fits_with_margin(arch, global_batch, grid.shape, self)
        return PlanResult(chosen.plan, chosen.breakdown, chosen.memory, feasible, n)

    # -- exhaustive search -----------------------------------------------------------
    def exhaustive(self, arch: ModelArch, global_batch: int, grid: Grid, *, link_load: float = 0.0,
                   dp_only: bool = False) -> PlanResult | None:
        """The best feasible plan of ``grid`` over the whole search space (see module doc);
        None when nothing fits."""
        pp = grid.pp
        n_layers = len(arch.layers())
        if pp > n_layers or (dp_only and pp > 1):
            return None
        gpu = get_gpu(grid.gpu_type)
        gpn = grid.shape.gpus_per_node
        pc = self.cfg.planner
        splits = list(enumerate_splits(n_layers, pp, self.split(arch, gpu, pp), pc.max_exhaustive_splits,
                                       pc.split_perturbation))
        best, n = None, 0
        for tp in self.tp_options(arch, grid, within_node=False, dp_only=dp_only, global_batch=global_batch):
            dp = grid.num_gpus // pp // tp
            per_replica = max(1, math.ceil(global_batch / dp))
            ms = sorted(set(pow2_upto(min(per_replica, pc.max_microbatches)) +
                            ([per_replica] if per_replica <= pc.max_microbatches else []))) \
                if self.accumulates(dp_only) else [1]
            eps = [1] if dp_only else self.ep_options(arch, dp, tp, gpn)   # pure DP replicates experts
            for m, ep in itertools.product(ms, eps):
                mb = micro_batch_size(global_batch, dp, m)
                table = self.table(arch, mb, tp, dp, gpu, gpn, link_load, ep)
                mem = self.memtable(arch, mb, tp, dp, gpn, ep)
                for schedule in ("1f1b", "gpipe"):
                    for split in splits:
                        n += 1
                        mbd = mem.breakdown(split, m, schedule)
                        if not mbd.fits(gpu, self.cfg.memory):
                            continue
                        bd = table.breakdown(split, m, schedule)
                        if best is None or bd.iteration_time_s < best[1].iteration_time_s - 1e-12:
                            best = (Plan(pp, dp, tp, split, m, schedule, ep), bd, mbd)
        if best is None:
            return None
        return PlanResult(best[0], best[1], best[2], True, n)


def best_shape_result(planner: Planner, model: str, global_batch: int, shape: Shape, *,
                      dp_only: bool = False) -> PlanResult | None:
    """The fastest feasible proxy plan over the pipeline depths of one resource shape
    (the measured table holds the best plan the authors' search found for that shape)."""
    arch = get_model(model)
    best = None
    n = shape.num_gpus
    for pp in range(1, n + 1):
        if n % pp or pp > len(arch.layers()):
            continue
        r = planner.proxy(arch, global_batch, Grid(shape, pp), dp_only=dp_only)
        if r is None or not r.feasible:
            continue
        if best is None or r.iteration_time_s < best.iteration_time_s:
            best = r
    return best


# Memory fit of a grid's low-memory plans, shared by the proxy plan's feasibility (the grid
# memory margin) and the grid enumeration (``estimators.grids``, whose module doc describes
# the low-memory plans).
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
