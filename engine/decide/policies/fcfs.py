"""First come, first served: each job runs on exactly what its user asked for. It
knows no job's length and decides from no estimate.

- Shape: the requested GPU type and count, laid out as compactly as that type's nodes
  allow (fewest nodes, equal GPUs on each), pipeline depth 1 (the plan inside is the
  job's own business; the oracle's truth is the best plan on that shape).
- A job with no request gets ``default_gpus`` GPUs (default 1) of ``default_gpu_type``
  (default: the type the cluster has most GPUs of; ties by name). A request the cluster
  can never hold (unknown type, more GPUs than the type has or a node layout it lacks)
  is never scheduled and shows up as never placed.
- Order: arrival time, then job id. Running jobs are never preempted or moved.
- ``backfill`` (default True): a later job may start when it fits in what is left.
  Without it the first job that does not fit blocks every later one
  (``block_scope="cluster"``, default) or only later jobs of its GPU type
  (``block_scope="gpu_type"``, as the Arena artifact's FCFS baseline).
- A job the engine has seen to be infeasible on its requested shape
  (``JobView.known_infeasible_shapes``) is skipped, and neither blocks nor holds GPUs.

The fit test uses the engine's placement rule (``engine.core.placement``) in FCFS order; the
engine then places larger shapes first, and its repair step covers the rare case where
that order matters (0 packing failures on the Arena traces).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.context import Decisions, RoundContext
from engine.core.placement import Placer
from engine.core.policy import Policy, register_policy
from instances.cluster import ClusterSpec
from instances.grid import Grid


@dataclass(frozen=True)
class FcfsPolicy(Policy):
    backfill: bool = True
    block_scope: str = "cluster"
    default_gpu_type: str | None = None
    default_gpus: int = 1
    name: str = "fcfs"
    # decisions depend only on which jobs are queued/running (and known-infeasible shapes),
    # so the simulator may skip rounds without arrivals or completions
    event_driven: bool = field(default=True, init=False)
    _placers: dict = field(default_factory=dict, compare=False, repr=False)   # topology cache per cluster

    def __post_init__(self):
        if not isinstance(self.backfill, bool):
            raise ValueError(f"fcfs: backfill must be a bool, got {self.backfill!r}")
        if self.block_scope not in ("cluster", "gpu_type"):
            raise ValueError(f"fcfs: block_scope must be 'cluster' or 'gpu_type', got {self.block_scope!r}")
        if not isinstance(self.default_gpus, int) or isinstance(self.default_gpus, bool) or self.default_gpus < 1:
            raise ValueError(f"fcfs: default_gpus must be a positive integer, got {self.default_gpus!r}")
        if self.default_gpu_type is not None:
            from instances.gpus import canonical_gpu_name
            object.__setattr__(self, "default_gpu_type", canonical_gpu_name(self.default_gpu_type))

    def _default_type(self, cluster: ClusterSpec) -> str:
        if self.default_gpu_type is not None:
            return self.default_gpu_type
        by = cluster.gpus_by_type()
        return min(by, key=lambda t: (-by[t], t))

    def _placer(self, cluster: ClusterSpec) -> Placer:
        """Topology precomputation, derived from the spec only (so caching it is pure)."""
        hit = self._placers.get(id(cluster))
        if hit is None or hit[0] is not cluster:
            self._placers.clear()
            hit = self._placers[id(cluster)] = (cluster, Placer(cluster))
        return hit[1]

    def decide(self, ctx: RoundContext) -> Decisions:
        placer = self._placer(ctx.cluster)
        free = placer.empty_free_map(ctx.unavailable_nodes)
        grids: dict[str, Grid] = {}
        free_of_type = dict(ctx.cluster.gpus_by_type())
        for n in ctx.unavailable_nodes:
            free_of_type[placer.type_of[n]] -= placer.size[n]
        leaving = []                      # running on a node out of service: they need GPUs elsewhere
        for v in ctx.jobs:
            if v.current is not None:
                if v.current.on_any(ctx.unavailable_nodes):
                    leaving.append(v)
                    continue
                grids[v.job_id] = v.current.grid
                placer.take(free, v.current.gpus)
                free_of_type[v.current.grid.gpu_type] -= v.current.grid.num_gpus
        for v in leaving:                 # first in line: they were running (no room: stopped)
            gpus = placer.choose(free, v.current.grid.shape)
            if gpus is not None:
                placer.take(free, gpus)
                free_of_type[v.current.grid.gpu_type] -= v.current.grid.num_gpus
                grids[v.job_id] = v.current.grid
        blocked: set[str] = set()
        shapes: dict = {}
        blocked_all = False
        for v in ctx.jobs:
            if v.current is not None:
                continue
            j = v.job
            gtype = j.requested_gpu_type or self._default_type(ctx.cluster)
            n = j.requested_gpus or self.default_gpus
            shape = shapes.get((gtype, n), False)
            if shape is False:
                shape = shapes[(gtype, n)] = ctx.cluster.fewest_nodes_shape(gtype, n)
            if shape is None or not placer.fits_somewhere(shape) or shape in v.known_infeasible_shapes:
                continue                      # can never run as requested: never placed
            if blocked_all or gtype in blocked:
                continue
            gpus = placer.choose(free, shape) if free_of_type[gtype] >= shape.num_gpus else None
            if gpus is None:
                if not self.backfill:
                    if self.block_scope == "cluster":
                        blocked_all = True
                    else:
                        blocked.add(gtype)
                continue
            placer.take(free, gpus)
            free_of_type[gtype] -= shape.num_gpus
            grids[v.job_id] = Grid(shape, 1)
        return Decisions(grids)


@register_policy("fcfs")
def make_fcfs(**config) -> FcfsPolicy:
    known = {"backfill", "block_scope", "default_gpu_type", "default_gpus"}
    bad = sorted(set(config) - known)
    if bad:
        raise ValueError(f"policy 'fcfs': unknown option(s) {bad}; known: {sorted(known)}")
    if "block_scope" in config and config.get("backfill", True) is not False:
        raise ValueError("policy 'fcfs': block_scope is read only with backfill=false (with backfill a job that does "
                         "not fit blocks nothing); drop block_scope or give backfill=false")
    return FcfsPolicy(**config)
