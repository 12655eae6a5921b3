"""The Sia artifact's virtual nodes for its heterogeneity-unaware Pollux: every node cut
into slices of the smallest node's GPU count (4 on its cluster: an 8-GPU node is two),
so that one search sees one kind of node. A solution (replicas per virtual node) comes
back as grids on pinned GPUs the way the artifact repairs it: a job keeps only its
replicas on the GPU type that holds most of them (a tie goes to the type with the higher
fp32 peak in the catalog: A100 before RTX 2080 Ti before T4, the artifact's order), and
here, where placements are symmetric, only the largest symmetric shape within what is
left (the artifact would run 3 + 1 GPUs on two nodes; this runs 3 on one).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from engine.core.context import Decisions, GpuId, JobView, RoundContext
from instances.goodput import ADAPTIVE
from instances.gpus import get_gpu
from instances.grid import Grid, Shape

VKey = tuple[int, int]              # (node_id, slice index on the node)


@dataclass(frozen=True)
class VirtualNodes:
    size: int                        # GPUs of a whole virtual node
    keys: list[VKey]
    index: dict[VKey, int]
    capacity: np.ndarray             # GPUs of each virtual node; 0 on nodes out of service
    gpu_type: list[str]              # of each virtual node

    @classmethod
    def of(cls, ctx: RoundContext, size: int) -> VirtualNodes:
        keys, cap, types = [], [], []
        for node in ctx.cluster.nodes():
            for s in range(-(-node.num_gpus // size)):
                keys.append((node.node_id, s))
                cap.append(0 if node.node_id in ctx.unavailable_nodes else min(size, node.num_gpus - s * size))
                types.append(node.gpu_type)
        return cls(size, keys, {k: i for i, k in enumerate(keys)}, np.array(cap, dtype=np.int64), types)

    def key_of(self, gpu: GpuId) -> VKey:
        return gpu[0], gpu[1] // self.size

    def one_type(self, row: np.ndarray) -> dict[int, int]:
        """A job's replicas per virtual node with those on every type but one dropped."""
        held = {int(v): int(row[v]) for v in np.flatnonzero(row)}
        if not held:
            return {}
        per_type: Counter[str] = Counter()
        for v, n in held.items():
            per_type[self.gpu_type[v]] += n
        keep = max(per_type, key=lambda t: (per_type[t], get_gpu(t).fp32_flops, t))
        return {v: n for v, n in held.items() if self.gpu_type[v] == keep}

    def _per_node(self, kept: dict[int, int]) -> dict[int, int]:
        out: dict[int, int] = {}
        for v, n in kept.items():
            out[self.keys[v][0]] = out.get(self.keys[v][0], 0) + n
        return out

    def shape_of(self, kept: dict[int, int]) -> Shape:
        """The largest symmetric shape within ``kept`` (fewer nodes on a tie)."""
        return self._symmetric(kept)[0]

    def _symmetric(self, kept: dict[int, int]) -> tuple[Shape, list[int]]:
        per_node = self._per_node(kept)
        nodes = sorted(per_node, key=lambda n: (-per_node[n], n))
        k = max(range(1, len(nodes) + 1), key=lambda k: (k * per_node[nodes[k - 1]], -k))
        t = self.gpu_type[next(iter(kept))]
        return Shape(t, k, per_node[nodes[k - 1]]), nodes[:k]

    def pin(self, ctx: RoundContext, views: list[JobView], base: np.ndarray, best: np.ndarray,
            kept: dict[str, dict[int, int]]) -> Decisions:
        """Grids and GPUs for the jobs in ``kept`` (rows of ``views``): a job whose
        solution is its current allocation keeps its GPUs; the others take free GPUs on
        their virtual nodes, those they hold first."""
        free: dict[int, set[int]] = {n.node_id: set(range(n.num_gpus)) for n in ctx.cluster.nodes()
                                     if n.node_id not in ctx.unavailable_nodes}
        grids: dict[str, Grid] = {}
        pins: dict[str, tuple[GpuId, ...]] = {}
        moved = []
        for i, v in enumerate(views):
            if v.job_id not in kept:
                continue
            if v.current is not None and np.array_equal(best[i], base[i]):
                grids[v.job_id], pins[v.job_id] = v.current.grid, v.current.gpus
                for n, g in v.current.gpus:
                    free[n].discard(g)
            else:
                moved.append(v)
        for v in moved:
            shape, nodes = self._symmetric(kept[v.job_id])
            held = set(v.current.gpus) if v.current is not None else set()
            gpus: list[GpuId] = []
            for n in nodes:
                want = shape.gpus_per_node
                for vi, count in sorted(kept[v.job_id].items()):
                    node, s = self.keys[vi]
                    if node != n or want == 0:
                        continue
                    slots = [g for g in range(s * self.size, (s + 1) * self.size) if g in free[n]]
                    slots.sort(key=lambda g: ((n, g) not in held, g))
                    take = slots[:min(count, want)]
                    if len(take) < min(count, want):
                        raise AssertionError(f"virtual node {(n, s)} has {len(slots)} free GPUs for {v.job_id}'s "
                                             f"{count} replicas: the search's capacity repair failed")
                    gpus.extend((n, g) for g in take)
                    free[n].difference_update(take)
                    want -= len(take)
            grids[v.job_id], pins[v.job_id] = Grid(shape), tuple(sorted(gpus))
        return Decisions(grids=grids, placements=pins, plans={j: ADAPTIVE for j in grids})
