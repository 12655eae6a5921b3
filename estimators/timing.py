"""Time of one layer pass and of one collective on a device.

Two sources, one interface:

- ``RooflineTimer`` / ``CatalogComm``: from catalog specs (instances/gpus.py) and the
  efficiency factors of ``EfficiencyConfig`` -- a roofline: a layer takes
  ``max(flops / (peak * eff_kind), bytes / (mem_bw * eff_mem)) + overhead`` (or the sum
  of the two terms, ``EfficiencyConfig.roofline_combine="sum"``: the layer's GEMM/conv
  kernels and its memory-bound elementwise kernels run one after another); a ring
  collective takes ``steps * latency + volume / (link_bw * eff_link)``. This is the
  "roofline transfer" used for every GPU type that was not profiled.
- ``ProfiledTimer`` / ``ProfiledComm``: from a profile store (estimators/profile_store.py):
  the achieved FLOP/s measured for the layer's signature on that device and dtype, and
  a latency + bandwidth fit of the measured collectives. Layers or collectives missing
  from the store fall back to the roofline, and the estimate's notes say so.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from instances.gpus import GpuType

from .config import EfficiencyConfig
from .layers import LayerCost

LINKS = ("intra", "inter")


@dataclass(frozen=True)
class RooflineTimer:
    eff: EfficiencyConfig = field(default_factory=EfficiencyConfig)
    source: str = "roofline"

    def times(self, cost: LayerCost, gpu: GpuType, dtype: str) -> tuple[float, float]:
        """(forward, backward) seconds of ``cost`` on one ``gpu``."""
        peak = self.eff.compute_peak_flops(gpu, dtype) * self.eff.compute_efficiency(cost.kind)
        w_half = self.eff.half_efficiency_flops
        if w_half > 0 and cost.fwd_flops > 0:     # saturating efficiency in the work per pass
            peak *= cost.fwd_flops / (cost.fwd_flops + w_half)
        bw = gpu.memory_bw_bytes_per_s * self.eff.memory_bw_efficiency
        bwd_flops = cost.bwd_flops + (cost.fwd_flops if self.eff.recompute_activations else 0.0)
        combine = max if self.eff.roofline_combine == "max" else (lambda c, m: c + m)
        f = combine(cost.fwd_flops / peak, cost.fwd_bytes / bw) + self.eff.layer_overhead_s
        b = combine(bwd_flops / peak, cost.bwd_bytes / bw) + self.eff.layer_overhead_s
        return f, b

    def profiled(self, cost: LayerCost, gpu: GpuType, dtype: str) -> bool:
        return False

    def optimizer_s(self, params: float, gpu: GpuType, dtype: str) -> float:
        """Optimizer step over ``params`` parameters: memory-bound traffic."""
        return params * self.eff.optimizer_traffic_bytes_per_param / (
            gpu.memory_bw_bytes_per_s * self.eff.memory_bw_efficiency)


@dataclass(frozen=True)
class CatalogComm:
    eff: EfficiencyConfig = field(default_factory=EfficiencyConfig)
    source: str = "catalog-links"

    def bandwidth(self, gpu: GpuType, link: str, link_load: float = 0.0) -> float:
        if link == "intra":
            return gpu.intra_node_bw_bytes_per_s * self.eff.intra_bw_efficiency
        if link == "inter":
            return gpu.inter_node_bw_bytes_per_s * self.eff.inter_bw_efficiency / (1.0 + link_load)
        raise ValueError(f"unknown link {link!r}; known: {LINKS}")

    def latency(self, gpu: GpuType, link: str) -> float:
        return self.eff.collective_latency_s

    def allreduce_s(self, nbytes: float, n: int, gpu: GpuType, link: str, link_load: float = 0.0) -> float:
        if n <= 1 or nbytes <= 0:
            return 0.0
        return 2 * (n - 1) * self.latency(gpu, link) + 2 * (n - 1) / n * nbytes / self.bandwidth(gpu, link, link_load)

    def allgather_s(self, nbytes: float, n: int, gpu: GpuType, link: str, link_load: float = 0.0) -> float:
        """``nbytes``: size of the gathered (full) tensor; reduce-scatter costs the same."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        return (n - 1) * self.latency(gpu, link) + (n - 1) / n * nbytes / self.bandwidth(gpu, link, link_load)

    reducescatter_s = allgather_s

    def alltoall_s(self, nbytes: float, n: int, gpu: GpuType, link: str, link_load: float = 0.0) -> float:
        """``nbytes``: what one rank holds before the exchange; (n-1)/n of it leaves."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        return (n - 1) * self.latency(gpu, link) + (n - 1) / n * nbytes / self.bandwidth(gpu, link, link_load)

    def p2p_s(self, nbytes: float, gpu: GpuType, link: str, link_load: float = 0.0) -> float:
        if nbytes <= 0:
            return 0.0
        return self.latency(gpu, link) + nbytes / self.bandwidth(gpu, link, link_load)


@dataclass(frozen=True)
class ProfiledTimer:
    """Layer times from measured achieved FLOP/s (``flops_per_s[(kind, signature, dtype, tp)]``)
    on ``device``; other devices and unprofiled layers use ``fallback``."""
    device: str
    flops_per_s: dict
    fallback: RooflineTimer
    source: str = "profiled"
    step_s_per_param: dict = field(default_factory=dict)   # dtype -> measured optimizer+step overhead
    step_fixed_s: dict = field(default_factory=dict)       # dtype -> per-step fixed overhead

    def optimizer_s(self, params: float, gpu: GpuType, dtype: str) -> float:
        if gpu.name == self.device and dtype in self.step_s_per_param:
            return self.step_fixed_s.get(dtype, 0.0) + params * self.step_s_per_param[dtype]
        return self.fallback.optimizer_s(params, gpu, dtype)

    def _rate(self, cost: LayerCost, gpu: GpuType, dtype: str):
        if gpu.name != self.device:
            return None
        return self.flops_per_s.get((cost.kind, cost.signature, dtype, cost.tp))

    def profiled(self, cost: LayerCost, gpu: GpuType, dtype: str) -> bool:
        return self._rate(cost, gpu, dtype) is not None

    def times(self, cost: LayerCost, gpu: GpuType, dtype: str) -> tuple[float, float]:
        rate = self._rate(cost, gpu, dtype)
        if rate is None:
            return self.fallback.times(cost, gpu, dtype)
        fwd_rate, bwd_rate = rate
        eff = self.fallback.eff
        bwd_flops = cost.bwd_flops + (cost.fwd_flops if eff.recompute_activations else 0.0)
        return cost.fwd_flops / fwd_rate + eff.layer_overhead_s, bwd_flops / bwd_rate + eff.layer_overhead_s


@dataclass(frozen=True)
class ProfiledComm(CatalogComm):
    """Collectives on ``device`` from its measured collectives: an operation measured at
    the same group size (intra-node) is read from its table (``tables``), interpolated
    linearly between the measured message sizes, below the smallest at the smallest's
    time, above the largest proportionally to size; everything else from a latency +
    bandwidth fit of the measured all-reduce and send/recv records (``fit``). The tables
    matter where one link model cannot describe every operation: gloo on CPU sums an
    all-reduce on the cores (4 MiB: 5.4 ms) while a send of the same size is a copy (0.9 ms)."""
    device: str = ""
    fit: dict = field(default_factory=dict)      # link -> (latency_s, bandwidth_bytes_per_s)
    tables: dict = field(default_factory=dict)   # (op, group_size) -> ((bytes, seconds), ...) sorted
    source: str = "profiled-links"

    def _table_s(self, op: str, nbytes: float, n: int, gpu: GpuType, link: str) -> float | None:
        pts = self.tables.get((op, n)) if gpu.name == self.device and link == "intra" else None
        if not pts:
            return None
        sizes = [b for b, _ in pts]
        i = bisect.bisect_left(sizes, nbytes)
        if i == 0:
            return pts[0][1]
        if i == len(pts):
            return pts[-1][1] * nbytes / pts[-1][0]
        (b0, t0), (b1, t1) = pts[i - 1], pts[i]
        return t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0)

    def allreduce_s(self, nbytes: float, n: int, gpu: GpuType, link: str, link_load: float = 0.0) -> float:
        if n <= 1 or nbytes <= 0:
            return 0.0
        t = self._table_s("all_reduce", nbytes, n, gpu, link)
        return super().allreduce_s(nbytes, n, gpu, link, link_load) if t is None else t

    def allgather_s(self, nbytes: float, n: int, gpu: GpuType, link: str, link_load: float = 0.0) -> float:
        if n <= 1 or nbytes <= 0:
            return 0.0
        t = self._table_s("all_gather", nbytes, n, gpu, link)
        return super().allgather_s(nbytes, n, gpu, link, link_load) if t is None else t

    def reducescatter_s(self, nbytes: float, n: int, gpu: GpuType, link: str, link_load: float = 0.0) -> float:
        if n <= 1 or nbytes <= 0:
            return 0.0
        t = self._table_s("reduce_scatter", nbytes, n, gpu, link)
        return super().reducescatter_s(nbytes, n, gpu, link, link_load) if t is None else t

    def p2p_s(self, nbytes: float, gpu: GpuType, link: str, link_load: float = 0.0) -> float:
        if nbytes <= 0:
            return 0.0
        t = self._table_s("send_recv", nbytes, 2, gpu, link)
        return super().p2p_s(nbytes, gpu, link, link_load) if t is None else t

    def bandwidth(self, gpu: GpuType, link: str, link_load: float = 0.0) -> float:
        if gpu.name == self.device and link in self.fit:
            bw = self.fit[link][1]
            return bw / (1.0 + link_load) if link == "inter" else bw
        return super().bandwidth(gpu, link, link_load)

    def latency(self, gpu: GpuType, link: str) -> float:
        if gpu.name == self.device and link in self.fit:
            return self.fit[link][0]
        return super().latency(gpu, link)
