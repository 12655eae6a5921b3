"""Peak memory per rank of a plan, so that plans that do not fit are screened out.

Per rank of stage i (stage shapes are uniform, ``tp`` shards each layer):

- model state: the stage's parameters / tp (MoE experts also / the expert-parallel
  degree, layers.expert_parallel_degree) x ``MemoryConfig.state_bytes_per_param``
  (weights + gradients + optimizer state; Adam with fp32 master copy for fp16/bf16, or SGD
  momentum for the families ``MemoryConfig.optimizer_by_family`` names); with
  ``EfficiencyConfig.dp_sharded_optimizer`` the optimizer part is divided by ``dp``;
- activations kept for backward: the stage's per-micro-batch activation bytes (layers.py,
  already sharded by tp) x the micro-batches in flight: GPipe keeps all ``m``; 1F1B keeps
  ``min(m, pp - i)``. With activation recomputation only each layer's input is kept, plus
  one layer's full activations during its backward;
- pipeline buffers: one boundary tensor received and one sent per micro-batch in flight;
- a fixed framework reserve (CUDA context, allocator slack, workspaces).

A plan fits when the largest stage's peak is at most ``usable_fraction`` of the GPU's memory.
"""
from __future__ import annotations

from dataclasses import dataclass

from instances.arch import ModelArch
from instances.gpus import GpuType
from instances.plan import Plan

from .compose import micro_batch_size
from .config import EfficiencyConfig, MemoryConfig
from .layers import LayerCost, expert_parallel_degree, layer_costs


@dataclass(frozen=True)
class MemoryBreakdown:
    peak_bytes: float              # the largest stage's per-rank peak
    stage_peak_bytes: tuple[float, ...]
    state_bytes: float             # of the peak stage
    activation_bytes: float        # of the peak stage
    reserve_bytes: float

    def fits(self, gpu: GpuType, cfg: MemoryConfig, margin: float = 1.0) -> bool:
        """The peak x ``margin`` is at most ``usable_fraction`` of the GPU's memory."""
        return self.peak_bytes * margin <= gpu.memory_bytes * cfg.usable_fraction


def in_flight(schedule: str, microbatches: int, pp: int, stage: int) -> int:
    if schedule == "gpipe":
        return microbatches
    return min(microbatches, pp - stage)


class MemoryTable:
    """Prefix sums of per-layer state and activation bytes at one (micro-batch, tp), so that
    many stage splits are checked in O(pp) each."""

    def __init__(self, arch: ModelArch, costs: tuple[LayerCost, ...], tp: int, cfg: MemoryConfig,
                 eff: EfficiencyConfig, ep: int = 1, dp: int = 1):
        self.cfg, self.tp, self.costs = cfg, tp, costs
        self.recompute = eff.recompute_activations
        per_param = cfg.state_bytes_per_param(arch.dtype_bytes, arch.base_family,
                                              dp if eff.dp_sharded_optimizer else 1)
        ps, pa, pk = [0.0], [0.0], [0.0]
        for c in costs:
            ps.append(ps[-1] + c.rank_params(ep) * per_param)
            pa.append(pa[-1] + (c.output_bytes / tp if self.recompute else c.activation_bytes))
            pk.append(max(pk[-1], c.activation_bytes))
        self.ps, self.pa = ps, pa

    def breakdown(self, stage_layers: tuple[int, ...], microbatches: int, schedule: str) -> MemoryBreakdown:
        pp, a = len(stage_layers), 0
        peaks, parts = [], []
        for i, n in enumerate(stage_layers):
            b = a + n
            state = self.ps[b] - self.ps[a]
            act_mb = self.pa[b] - self.pa[a]
            extra = (max(c.activation_bytes for c in self.costs[a:b])
                     if self.recompute and self.cfg.recompute_layer_peak else 0.0)
            k = in_flight(schedule, microbatches, pp, i)
            buffers = 2 * self.costs[b - 1].output_bytes / self.tp * k if pp > 1 else 0.0
            act = act_mb * k + extra + buffers
            peaks.append(state + act + self.cfg.framework_reserve_bytes)
            parts.append((state, act))
            a = b
        top = max(range(pp), key=peaks.__getitem__)
        return MemoryBreakdown(peaks[top], tuple(peaks), parts[top][0], parts[top][1],
                               self.cfg.framework_reserve_bytes)


def plan_memory(arch: ModelArch, plan: Plan, *, global_batch: int, cfg: MemoryConfig,
                eff: EfficiencyConfig | None = None, gpus_per_node: int | None = None) -> MemoryBreakdown:
    """Per-rank peak memory of ``plan`` (the largest stage); ``gpus_per_node`` bounds the
    expert-parallel degree as in the composition (None: unbounded)."""
    eff = eff or EfficiencyConfig()
    if sum(plan.stage_layers) != len(arch.layers()):
        raise ValueError(f"plan covers {sum(plan.stage_layers)} layers, model {arch.name} has "
                         f"{len(arch.layers())}")
    mb = micro_batch_size(global_batch, plan.dp, plan.microbatches)
    costs = layer_costs(arch, micro_batch=mb, tp=plan.tp, backward_ratio=eff.backward_flops_ratio)
    max_ep = None if gpus_per_node is None else max(1, gpus_per_node // plan.tp)
    ep = plan.ep or expert_parallel_degree(arch, plan.dp, max_ep)
    return MemoryTable(arch, costs, plan.tp, cfg, eff, ep, plan.dp).breakdown(plan.stage_layers, plan.microbatches,
                                                                 plan.schedule)
