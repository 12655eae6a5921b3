"""Composition: from per-layer costs to the iteration time of a plan.

Rank layout (Megatron order): tensor ranks are adjacent, then data-parallel replicas,
then pipeline stages: rank = (stage * dp + replica) * tp + shard. A group whose ranks
all sit in one node uses the intra-node link; otherwise the inter-node link (the
catalog's per-GPU share of the node's network).

Per micro-batch, stage i takes ``f_i`` forward and ``b_i`` backward: its layers'
roofline/profiled times + its tensor-parallel all-reduces (+ the measured per-layer
tensor-parallel runtime overhead ``tp_layer_overhead_*_s``; embeddings and head whole on
every tensor rank with ``tp_replicated_embedding_head``; and once per iteration the
measured ``tp_optimizer_overhead_s`` on the optimizer step) + the pipeline send to the
next stage (forward) or the previous one (backward) (+ with more than one stage the
measured per-pass pipeline schedule overhead ``pp_pass_overhead_s``). The pipeline time of ``m``
micro-batches over ``p`` stages (no interleaving):

- GPipe (all forwards, then all backwards): ``sum_i (f_i + b_i) + (m - 1) * (max f + max b)``
  (exact: each phase is a flow shop of identical jobs);
- 1F1B: ``sum_i (f_i + b_i) + (m - 1) * max_i (f_i + b_i)`` for equal stages; unequal
  stages are replayed exactly through the schedule's dependency program;

both ``(m + p - 1) * (f + b)`` for equal stages (the bubble is the same; 1F1B keeps
fewer activations). ``simulate_pipeline`` is an independent event simulation of both
schedules that the tests check these against. Then the data-parallel gradient all-reduce (ring,
per stage over its ``dp`` replicas; with overlap, up to ``dp_overlap_fraction`` of it
hides under the last micro-batch's backward) and the optimizer step (memory-bound
traffic of ``optimizer_traffic_bytes_per_param`` per parameter) are added. With
``dp_sharded_optimizer`` (Alpa's prefer_reduce_scatter) the all-reduce becomes a
reduce-scatter (overlappable as above) + an all-gather of the updated weights after the
update (exposed), and the update covers 1/dp of the stage's parameters.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from instances.arch import ModelArch
from instances.gpus import GpuType
from instances.plan import Plan

from .config import EfficiencyConfig
from .layers import TRANSFORMER_KINDS, expert_parallel_degree, layer_costs

REPLICATED_UNDER_TP = ("embedding", "head")     # with EfficiencyConfig.tp_replicated_embedding_head


@dataclass(frozen=True)
class Breakdown:
    iteration_time_s: float
    pipeline_s: float
    stage_fwd_s: tuple[float, ...]          # per micro-batch, including TP and p2p comm
    stage_bwd_s: tuple[float, ...]
    compute_s: float                        # sum over micro-batches of the slowest stage's compute
    tp_comm_s: float                        # same, tensor-parallel all-reduces
    p2p_s: float                            # same, pipeline sends
    bubble_s: float                         # pipeline_s minus the slowest stage's busy time
    dp_comm_s: float                        # full gradient all-reduce time (slowest stage)
    dp_exposed_s: float                     # the part not hidden under backward
    optimizer_s: float
    micro_batch: int
    profiled_layers: int = 0                # layers timed from the profile store
    total_layers: int = 0
    step_overhead_s: float = 0.0            # EfficiencyConfig.step_overhead_s
    pp_overhead_s: float = 0.0              # as compute_s, EfficiencyConfig.pp_pass_overhead_s

    def shares(self) -> dict[str, float]:
        t = self.iteration_time_s
        return {"compute": self.compute_s / t, "tp_comm": self.tp_comm_s / t, "p2p": self.p2p_s / t,
                "bubble": self.bubble_s / t, "dp_exposed": self.dp_exposed_s / t,
                "optimizer": self.optimizer_s / t, "step_overhead": self.step_overhead_s / t,
                "pp_overhead": self.pp_overhead_s / t}


def pipeline_time(fwd: list[float] | tuple[float, ...], bwd: list[float] | tuple[float, ...],
                  microbatches: int, schedule: str) -> float:
    """Makespan of one iteration's pipeline: the GPipe closed form (exact), and for 1F1B
    the closed form when stages are equal, else the exact event simulation of the
    schedule (the closed form is off by up to ~6% for stages within 10% of each other)."""
    m = microbatches
    if schedule == "gpipe":
        return sum(fwd) + sum(bwd) + (m - 1) * (max(fwd) + max(bwd))
    if schedule == "1f1b":
        tot = [f + b for f, b in zip(fwd, bwd)]
        if len(tot) == 1 or m == 1 or (max(fwd) - min(fwd) <= 1e-12 * max(fwd) and
                                       max(bwd) - min(bwd) <= 1e-12 * max(bwd)):
            return sum(tot) + (m - 1) * max(tot)
        return _replay(_schedule_program(len(fwd), m, "1f1b"), fwd, bwd)
    raise ValueError(f"unknown pipeline schedule {schedule!r}")


def _stage_orders(p: int, m: int, schedule: str) -> list[list[tuple[str, int]]]:
    orders = []
    for i in range(p):
        if schedule == "gpipe":
            ops = [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
        elif schedule == "1f1b":
            warm = min(p - i - 1, m)
            ops = [("F", j) for j in range(warm)]
            nf, nb = warm, 0
            while nb < m:
                if nf < m:
                    ops.append(("F", nf))
                    nf += 1
                ops.append(("B", nb))
                nb += 1
        else:
            raise ValueError(f"unknown pipeline schedule {schedule!r}")
        orders.append(ops)
    return orders


@lru_cache(maxsize=512)
def _schedule_program(p: int, m: int, schedule: str) -> tuple[tuple[int, bool, int], ...]:
    """The schedule's operations in one dependency-respecting order, as (stage, is_forward,
    index of the cross-stage dependency in this program or -1). Independent of durations."""
    orders = _stage_orders(p, m, schedule)
    pos, index, prog = [0] * p, {}, []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for i in range(p):
            while pos[i] < len(orders[i]):
                kind, j = orders[i][pos[i]]
                dep = ("F", i - 1, j) if kind == "F" and i > 0 else (("B", i + 1, j) if kind == "B" and i < p - 1
                                                                    else None)
                if dep is not None and dep not in index:
                    break
                index[(kind, i, j)] = len(prog)
                prog.append((i, kind == "F", -1 if dep is None else index[dep]))
                pos[i] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked")
    return tuple(prog)


def _replay(prog, fwd, bwd) -> float:
    free = [0.0] * len(fwd)
    end = [0.0] * len(prog)
    for k, (i, is_f, dep) in enumerate(prog):
        start = free[i] if dep < 0 or free[i] >= end[dep] else end[dep]
        free[i] = end[k] = start + (fwd[i] if is_f else bwd[i])
    return max(free)


def simulate_pipeline(fwd, bwd, microbatches: int, schedule: str) -> float:
    """Event simulation of a pipeline schedule: each stage runs its operations in the
    schedule's order; F(i, j) needs F(i-1, j); B(i, j) needs B(i+1, j) and F(i, j)."""
    p, m = len(fwd), microbatches
    orders = _stage_orders(p, m, schedule)
    done: dict[tuple[str, int, int], float] = {}
    pos = [0] * p
    free = [0.0] * p
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for i in range(p):
            while pos[i] < len(orders[i]):
                kind, j = orders[i][pos[i]]
                deps = [("F", i - 1, j)] if kind == "F" and i > 0 else []
                if kind == "B":
                    deps = [("F", i, j)] + ([("B", i + 1, j)] if i < p - 1 else [])
                if any(d not in done for d in deps):
                    break
                start = max([free[i]] + [done[d] for d in deps])
                free[i] = start + (fwd[i] if kind == "F" else bwd[i])
                done[(kind, i, j)] = free[i]
                pos[i] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked")
    return max(free)


def _within_node(span_ranks: int, gpus_per_node: int) -> bool:
    return span_ranks <= gpus_per_node


def micro_batch_size(global_batch: int, dp: int, microbatches: int) -> int:
    return max(1, math.ceil(global_batch / (dp * microbatches)))


def stage_slices(plan: Plan) -> list[tuple[int, int]]:
    out, start = [], 0
    for n in plan.stage_layers:
        out.append((start, start + n))
        start += n
    return out


class StageTable:
    """Per-layer times and sizes of ``arch`` at one (micro-batch, tp, dp) on one GPU type,
    as prefix sums, so that many stage splits are composed in O(pp) each (the planner's
    exhaustive search relies on this)."""

    def __init__(self, arch: ModelArch, *, micro_batch: int, tp: int, dp: int, gpu: GpuType,
                 gpus_per_node: int, timer, comm, eff: EfficiencyConfig, link_load: float = 0.0,
                 ep: int = 0):
        self.arch, self.mb, self.tp, self.dp, self.gpu = arch, micro_batch, tp, dp, gpu
        self.gpn, self.comm, self.eff, self.link_load = gpus_per_node, comm, eff, link_load
        self.timer = timer
        self.costs = layer_costs(arch, micro_batch=micro_batch, tp=tp, backward_ratio=eff.backward_flops_ratio)
        if tp > 1 and eff.tp_replicated_embedding_head:     # whole on every tensor rank, no all-reduce
            whole = layer_costs(arch, micro_batch=micro_batch, tp=1, backward_ratio=eff.backward_flops_ratio)
            self.costs = tuple(w if c.kind in REPLICATED_UNDER_TP else c for c, w in zip(self.costs, whole))
        tp_link = "intra" if _within_node(tp, gpus_per_node) else "inter"
        self.dp_link = "intra" if _within_node(dp * tp, gpus_per_node) else "inter"
        self.ep = ep or expert_parallel_degree(arch, dp, max(1, gpus_per_node // tp))
        ep_link = "intra" if _within_node(self.ep * tp, gpus_per_node) else "inter"
        pf, pb, ptf, ptb, pp_, pc = [0.0], [0.0], [0.0], [0.0], [0.0], [0]
        for c in self.costs:
            lf, lb = timer.times(c, gpu, arch.dtype)
            tf = tb = 0.0
            if c.a2a_bytes and self.ep > 1:      # expert dispatch and combine, forward and backward
                a2a = comm.alltoall_s(c.a2a_bytes, self.ep, gpu, ep_link, link_load)
                tf += 2 * a2a
                tb += 2 * a2a
            if tp > 1:
                ar = comm.allreduce_s(c.tp_allreduce_bytes, tp, gpu, tp_link, link_load)
                tf += ar * c.tp_allreduces_fwd + comm.allreduce_s(c.tp_small_allreduce_bytes, tp, gpu,
                                                                  tp_link, link_load)
                tb += ar * c.tp_allreduces_bwd
                if c.kind in TRANSFORMER_KINDS:
                    tf += eff.tp_layer_overhead_fwd_s
                    tb += eff.tp_layer_overhead_bwd_s
            pf.append(pf[-1] + lf)
            pb.append(pb[-1] + lb)
            ptf.append(ptf[-1] + tf)
            ptb.append(ptb[-1] + tb)
            pp_.append(pp_[-1] + c.rank_params(self.ep))
            pc.append(pc[-1] + int(timer.profiled(c, gpu, arch.dtype)))
        self.pf, self.pb, self.ptf, self.ptb, self.pparams, self.pprof = pf, pb, ptf, ptb, pp_, pc

    def _send(self, boundary_layer: int, boundary_rank: int) -> float:
        link = "inter" if boundary_rank % self.gpn == 0 else "intra"
        return self.comm.p2p_s(self.costs[boundary_layer].output_bytes / self.tp, self.gpu, link, self.link_load)

    def breakdown(self, stage_layers: tuple[int, ...], microbatches: int, schedule: str) -> Breakdown:
        eff, pp = self.eff, len(stage_layers)
        stage_ranks = self.dp * self.tp
        fwd, bwd, comp, tpc, p2p, dp_ar, dp_ag, bwd_comp, params = [], [], [], [], [], [], [], [], []
        a = 0
        o = eff.pp_pass_overhead_s if pp > 1 else 0.0      # per stage, per micro-batch pass
        for i, n in enumerate(stage_layers):
            b = a + n
            f_c, b_c = self.pf[b] - self.pf[a], self.pb[b] - self.pb[a]
            t_f, t_b = self.ptf[b] - self.ptf[a], self.ptb[b] - self.ptb[a]
            send_f = self._send(b - 1, (i + 1) * stage_ranks) if i < pp - 1 else 0.0
            send_b = self._send(a - 1, i * stage_ranks) if i > 0 else 0.0
            fwd.append(f_c + t_f + send_f + o)
            bwd.append(b_c + t_b + send_b + o)
            comp.append(f_c + b_c)
            bwd_comp.append(b_c + t_b)
            tpc.append(t_f + t_b)
            p2p.append(send_f + send_b)
            prm = self.pparams[b] - self.pparams[a]
            params.append(prm)
            grad_bytes = prm * self.arch.dtype_bytes
            if eff.dp_sharded_optimizer:    # reduce-scatter (overlappable) now, all-gather after the update
                dp_ar.append(self.comm.reducescatter_s(grad_bytes, self.dp, self.gpu, self.dp_link, self.link_load))
                dp_ag.append(self.comm.allgather_s(grad_bytes, self.dp, self.gpu, self.dp_link, self.link_load))
            else:
                dp_ar.append(self.comm.allreduce_s(grad_bytes, self.dp, self.gpu, self.dp_link, self.link_load))
                dp_ag.append(0.0)
            a = b
        m = microbatches
        pipe = pipeline_time(fwd, bwd, m, schedule)
        slow = max(range(pp), key=lambda k: fwd[k] + bwd[k])
        busy = m * (fwd[slow] + bwd[slow])
        if eff.dp_overlap:
            exposed = [max(ar - bw, (1 - eff.dp_overlap_fraction) * ar) for ar, bw in zip(dp_ar, bwd_comp)]
        else:
            exposed = list(dp_ar)
        exposed = [e + ag for e, ag in zip(exposed, dp_ag)]
        shard = self.dp if eff.dp_sharded_optimizer else 1
        opt = self.timer.optimizer_s(max(params) / shard, self.gpu, self.arch.dtype) + (
            eff.tp_optimizer_overhead_s if self.tp > 1 else 0.0)
        total = pipe + max(exposed) + opt + eff.step_overhead_s
        return Breakdown(total, pipe, tuple(fwd), tuple(bwd), m * comp[slow], m * tpc[slow], m * p2p[slow],
                         max(0.0, pipe - busy), max(a + g for a, g in zip(dp_ar, dp_ag)), max(exposed), opt, self.mb,
                         self.pprof[-1], len(self.costs), eff.step_overhead_s, m * 2 * o)


def compose(arch: ModelArch, plan: Plan, *, global_batch: int, gpu: GpuType, gpus_per_node: int,
            timer, comm, eff: EfficiencyConfig, link_load: float = 0.0) -> Breakdown:
    """Iteration time of ``plan`` for ``arch`` at ``global_batch`` on ``gpu`` nodes."""
    if sum(plan.stage_layers) != len(arch.layers()):
        raise ValueError(f"plan covers {sum(plan.stage_layers)} layers, model {arch.name} has "
                         f"{len(arch.layers())}")
    mb = micro_batch_size(global_batch, plan.dp, plan.microbatches)
    table = StageTable(arch, micro_batch=mb, tp=plan.tp, dp=plan.dp, gpu=gpu, gpus_per_node=gpus_per_node,
                       timer=timer, comm=comm, eff=eff, link_load=link_load, ep=plan.ep)
    return table.breakdown(plan.stage_layers, plan.microbatches, plan.schedule)
