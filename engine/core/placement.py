"""Placement: map each chosen grid to concrete GPUs ``(node_id, index)``.

Order of work, per round:

1. Jobs whose chosen shape equals the shape they hold keep their GPUs (a job whose GPUs
   do not change is not restarted; a pipeline-depth change on the same GPUs keeps them
   too, and is priced as a plan change by the reconfiguration model).
2. GPUs a policy pinned (``Decisions.placements``) are honoured when they are free and
   match the grid's shape; a pin that is not is ignored and the job placed normally.
3. The other jobs, larger shapes first (ties: the policy's order). A shape of ``k``
   nodes x ``m`` GPUs takes ``k`` distinct nodes of its GPU type with ``m`` free GPUs
   each, chosen by: most overlap with the GPUs the job held before (a move to a superset
   or subset keeps what it can), then best fit (the fullest node that still fits, which
   keeps whole nodes free for large shapes), then the same switch for multi-node shapes.
4. A shape that does not fit triggers a repair: the jobs of that GPU type placed in step
   3 this round are lifted, the failing job placed first, and the lifted ones placed
   again. If that fails too the round's earlier choices are restored and the job counts
   as a packing failure (it stays queued, or is stopped, for this round).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable, Mapping

from instances.cluster import ClusterSpec
from instances.grid import Grid, Shape

from .allocation import Allocation, GpuId, node_masks

FreeMap = list[int]             # per node, a bit mask of its free GPU indices


@lru_cache(maxsize=1 << 14)
def _canonical(gpus: tuple[GpuId, ...]) -> tuple[GpuId, ...]:
    """``gpus`` sorted, each once."""
    return tuple(sorted(set(gpus)))


def _lowest(mask: int, count: int) -> int:
    """The ``count`` lowest set bits of ``mask``."""
    out = 0
    while count > 0 and mask:
        b = mask & -mask
        out |= b
        mask ^= b
        count -= 1
    return out


def _indices(mask: int) -> list[int]:
    out = []
    while mask:
        b = mask & -mask
        out.append(b.bit_length() - 1)
        mask ^= b
    return out


@dataclass(frozen=True)
class PlacementResult:
    allocations: Mapping[str, Allocation]
    failed: tuple[str, ...] = ()          # job ids whose grid could not be placed
    repaired: int = 0                     # failures fixed by the repair step
    pins_rejected: tuple[str, ...] = ()   # pinned GPUs that were not usable
    kept: tuple[str, ...] = field(default=())   # jobs that kept their GPUs


class Placer:
    """Precomputed topology of one cluster; ``place`` is called once per round."""

    def __init__(self, spec: ClusterSpec):
        self.spec = spec
        self.nodes = spec.nodes()
        self.size = [n.num_gpus for n in self.nodes]
        self.switch = [n.switch_id for n in self.nodes]
        self.type_of = [n.gpu_type for n in self.nodes]
        self.nodes_by_type: dict[str, list[int]] = {}
        for n in self.nodes:
            self.nodes_by_type.setdefault(n.gpu_type, []).append(n.node_id)
        self._fits: dict[Shape, bool] = {}
        self._full: FreeMap = [(1 << s) - 1 for s in self.size]

    def fits_somewhere(self, shape: Shape) -> bool:
        """Whether ``shape`` fits on the empty cluster."""
        hit = self._fits.get(shape)
        if hit is None:
            ok = sum(1 for n in self.nodes_by_type.get(shape.gpu_type, ()) if self.size[n] >= shape.gpus_per_node)
            hit = self._fits[shape] = ok >= shape.num_nodes
        return hit

    # ------------------------------------------------------------------------------
    def place(self, requests: Mapping[str, Grid], current: Mapping[str, Allocation],
              pinned: Mapping[str, Iterable[GpuId]] | None = None,
              unavailable: frozenset[int] = frozenset()) -> PlacementResult:
        """Place every requested grid; ``current`` holds the allocations jobs have now;
        nothing goes on an ``unavailable`` node (a job holding a GPU there is placed anew,
        as if it asked for another shape)."""
        pinned = pinned or {}
        free = self.empty_free_map(unavailable)
        out: dict[str, Allocation] = {}
        kept: list[str] = []
        rest: list[str] = []
        for jid, grid in requests.items():
            cur = current.get(jid)
            if (cur is not None and (cur.grid is grid or cur.grid.shape == grid.shape) and jid not in pinned
                    and not cur.on_any(unavailable)):
                self._take_masks(free, cur.node_masks, cur.gpus)
                out[jid] = cur if cur.grid is grid or cur.grid == grid else Allocation(grid, cur.gpus)
                kept.append(jid)
            else:
                rest.append(jid)
        pins_rejected: list[str] = []
        normal: list[str] = []
        for jid in rest:
            if jid in pinned:
                cur = current.get(jid)
                if cur is not None and pinned[jid] is cur.gpus and cur.gpus_canonical:
                    gpus, same = cur.gpus, True                      # pinned where it is (the usual case)
                else:
                    gpus = _canonical(tuple(pinned[jid]))
                    same = cur is not None and cur.gpus == gpus
                masks = cur.node_masks if same else node_masks(gpus)
                if self._pin_ok(free, requests[jid], gpus, masks):
                    self._take_masks(free, masks, gpus)
                    out[jid] = (cur if same and (cur.grid is requests[jid] or cur.grid == requests[jid])
                                else Allocation(requests[jid], gpus))
                    continue
                pins_rejected.append(jid)
            normal.append(jid)
        order = sorted(range(len(normal)), key=lambda i: (-requests[normal[i]].num_gpus, i))
        placed_by_type: dict[str, list[str]] = {}
        failed: list[str] = []
        repaired = 0
        for i in order:
            jid = normal[i]
            grid = requests[jid]
            prev = current.get(jid)
            gpus = self._choose(free, grid.shape, prev.gpus if prev else ())
            if gpus is None:
                gpus_map = self._repair(free, jid, requests, current, placed_by_type.get(grid.gpu_type, []), out)
                if gpus_map is None:
                    failed.append(jid)
                    continue
                repaired += 1
                placed_by_type.setdefault(grid.gpu_type, []).append(jid)
                continue
            self._take(free, gpus)
            out[jid] = Allocation(grid, gpus)
            placed_by_type.setdefault(grid.gpu_type, []).append(jid)
        return PlacementResult(out, tuple(failed), repaired, tuple(pins_rejected), tuple(kept))

    # -- public helpers for policies that test fits the engine's way ---------------
    def empty_free_map(self, unavailable: frozenset[int] = frozenset()) -> FreeMap:
        """Free GPUs per node of the empty cluster, none on ``unavailable`` nodes
        (mutable, opaque: for ``choose``/``take``)."""
        free = self._full.copy()
        for n in unavailable:
            if 0 <= n < len(free):
                free[n] = 0
        return free

    def choose(self, free: FreeMap, shape: Shape,
               prefer: tuple[GpuId, ...] = ()) -> tuple[GpuId, ...] | None:
        """GPUs the engine's rule would pick for ``shape`` in ``free`` (None: no fit)."""
        return self._choose(free, shape, prefer)

    def take(self, free: FreeMap, gpus: Iterable[GpuId]) -> None:
        self._take(free, tuple(gpus))

    # ------------------------------------------------------------------------------
    @staticmethod
    def _take(free: FreeMap, gpus: tuple[GpuId, ...]) -> None:
        Placer._take_masks(free, node_masks(gpus), gpus)

    @staticmethod
    def _take_masks(free: FreeMap, masks: tuple[tuple[int, int, int], ...] | None, gpus: tuple[GpuId, ...]) -> None:
        if masks is None:
            raise KeyError(f"GPUs {gpus} hold a negative index")
        for n, m, _ in masks:
            if free[n] & m != m:
                raise KeyError(f"GPUs {gpus}: not all free on node {n}")
            free[n] &= ~m

    @staticmethod
    def _give(free: FreeMap, gpus: tuple[GpuId, ...]) -> None:
        for n, m, _ in node_masks(gpus) or ():
            free[n] |= m

    def _pin_ok(self, free: FreeMap, grid: Grid, gpus: tuple[GpuId, ...],
                masks: tuple[tuple[int, int, int], ...] | None) -> bool:
        """Whether the GPUs ``gpus`` (with their ``node_masks``) are free and fit ``grid``."""
        if len(gpus) != grid.num_gpus:
            return False
        if masks is None or len(masks) != grid.shape.num_nodes:
            return False
        gtype, gpn, n_nodes = grid.gpu_type, grid.shape.gpus_per_node, len(self.nodes)
        for n, m, c in masks:
            if not (0 <= n < n_nodes) or self.type_of[n] != gtype or free[n] & m != m or c != gpn:
                return False
        return True

    def _choose(self, free: FreeMap, shape: Shape, prefer: tuple[GpuId, ...]) -> tuple[GpuId, ...] | None:
        k, m = shape.num_nodes, shape.gpus_per_node
        pref = {n: mask for n, mask, _ in node_masks(prefer) or ()} if prefer else {}
        nodes = self.nodes_by_type.get(shape.gpu_type, ())
        if pref:
            cands = []
            for n in nodes:
                f = free[n].bit_count()
                if f >= m:
                    ov = min(m, (pref[n] & free[n]).bit_count()) if n in pref else 0
                    cands.append((-ov, f, n))
        else:                                           # fast path: no overlap to score
            cands = [(0, f, n) for n, f in zip(nodes, map(int.bit_count, map(free.__getitem__, nodes))) if f >= m]
        if len(cands) < k:
            return None
        if k == 1:
            chosen = [min(cands)[2]]
        else:
            by_switch: dict[int, list[tuple[int, int, int]]] = {}
            for c in cands:
                by_switch.setdefault(self.switch[c[2]], []).append(c)
            best = None
            for sw, cs in by_switch.items():
                if len(cs) >= k:
                    cs.sort()
                    top = cs[:k]
                    score = (sum(c[0] for c in top), sum(c[1] for c in top), sw)
                    if best is None or score < best[0]:
                        best = (score, top)
            if best is None:
                cands.sort()
                top = cands[:k]
            else:
                top = best[1]
            chosen = [c[2] for c in top]
        gpus: list[GpuId] = []
        for n in chosen:
            # the GPUs it holds here first (lowest indices), then the lowest free others
            own = _lowest(pref.get(n, 0) & free[n], m)
            picked = own | _lowest(free[n] & ~own, m - own.bit_count())
            gpus.extend((n, i) for i in _indices(picked))
        return tuple(sorted(gpus))

    def _repair(self, free: FreeMap, jid: str, requests: Mapping[str, Grid],
                current: Mapping[str, Allocation], placed: list[str],
                out: dict[str, Allocation]) -> dict[str, Allocation] | None:
        """Lift this round's placed jobs of the same type, place ``jid`` first, re-place them."""
        if not placed:
            return None
        saved = {p: out[p] for p in placed}
        for p in placed:
            self._give(free, out.pop(p).gpus)
        new: dict[str, Allocation] = {}
        for p in [jid] + placed:
            prev = current.get(p)
            gpus = self._choose(free, requests[p].shape, prev.gpus if prev else ())
            if gpus is None:
                for a in new.values():
                    self._give(free, a.gpus)
                for p2, a in saved.items():
                    self._take(free, a.gpus)
                    out[p2] = a
                return None
            self._take(free, gpus)
            new[p] = Allocation(requests[p], gpus)
        out.update(new)
        return new

