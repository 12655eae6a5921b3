"""What a job holds: an ``Allocation`` (a grid on concrete GPUs ``(node_id, index)``).
Below the round context and the reconfiguration cost model, which both read it: the
context names the cost model, the cost model never imports the context."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

from instances.grid import Grid

from .quick_init import quick_init

GpuId = tuple[int, int]          # (node_id, local GPU index on that node)


@quick_init
@dataclass(frozen=True)
class Allocation:
    grid: Grid
    gpus: tuple[GpuId, ...]      # sorted; len == grid.num_gpus

    def __post_init__(self):
        if len(self.gpus) != self.grid.num_gpus:
            raise ValueError(f"allocation holds {len(self.gpus)} GPUs for grid {self.grid}")

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(sorted({n for n, _ in self.gpus}))

    def on_any(self, nodes: frozenset[int]) -> bool:
        """Whether it holds a GPU on one of ``nodes`` (e.g. the nodes out of service)."""
        return bool(nodes) and any(n in nodes for n, _ in self.gpus)

    @cached_property
    def gpus_canonical(self) -> bool:
        """Whether ``gpus`` is sorted with each GPU once (the placer's form; kept with the
        allocation, as placement asks every round)."""
        g = self.gpus
        return all(a < b for a, b in zip(g, g[1:]))

    @cached_property
    def node_masks(self) -> tuple[tuple[int, int, int], ...] | None:
        """``node_masks(gpus)``, kept with the allocation (placement reads it every round)."""
        return node_masks(self.gpus)


@lru_cache(maxsize=1 << 14)
def node_masks(gpus: tuple[GpuId, ...]) -> tuple[tuple[int, int, int], ...] | None:
    """``gpus`` as (node, bit mask of its GPU indices, count) per node, in node order
    (None: a negative index); a GPU listed twice counts once. Memoized: pinned GPUs
    recur every round."""
    masks: dict[int, int] = {}
    for n, i in gpus:
        if i < 0:
            return None
        masks[int(n)] = masks.get(int(n), 0) | (1 << int(i))
    return tuple((n, m, m.bit_count()) for n, m in sorted(masks.items()))
