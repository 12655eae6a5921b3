"""Synthetic clusters and jobs, deterministic by seed, fast at 10,000 GPUs / jobs.

``synthetic_cluster(num_gpus, seed)``: 2-4 GPU types drawn from the catalog (never
``cpu``), each a node group with the catalog's typical GPUs per node; the GPU counts
are split by a seeded Dirichlet draw and the total is exactly ``num_gpus`` (a
remainder that does not fill a node becomes smaller nodes of powers of two). Groups
with more than ``nodes_per_switch`` nodes are split over several switches.

``synthetic_jobs(num_jobs, seed, *, cluster=None, ...)``: Poisson arrivals; (model,
global batch) pairs from the measured table, weighted by how often each appears in
Arena's Philly trace; a GPU request drawn from ``gpu_count_weights`` (capped by the
cluster); a requested type drawn in proportion to the cluster's GPUs of each type that
can hold the request; a log-normal duration on the requested allocation turned into an
iteration count with the truth oracle (so a job would run about that long); a seeded
fraction of jobs gets a deadline of ``arrival + slack x duration``.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .cluster import ClusterSpec, NodeGroup
from .errors import InputError
from .gpus import GPU_TYPES, canonical_gpu_name
from .jobs import Job
from .limits import check_time

SYNTHETIC_GPU_TYPES = ("h100-sxm", "h200", "a100-80gb", "a100-40gb", "v100-32gb", "a40", "a10", "l20")


@dataclass(frozen=True)
class SyntheticClusterConfig:
    gpu_types: tuple[str, ...] = SYNTHETIC_GPU_TYPES
    min_types: int = 2
    max_types: int = 4
    dirichlet_alpha: float = 2.0
    nodes_per_switch: int = 32

    def __post_init__(self):
        object.__setattr__(self, "gpu_types", tuple(canonical_gpu_name(t) for t in self.gpu_types))
        if not self.gpu_types or "cpu" in self.gpu_types:
            raise InputError("must name at least one GPU type, not 'cpu'", field="gpu_types")
        if not 1 <= self.min_types <= self.max_types:
            raise InputError("need 1 <= min_types <= max_types", field="min_types")
        if not self.dirichlet_alpha > 0 or self.nodes_per_switch < 1:
            raise InputError("dirichlet_alpha must be > 0 and nodes_per_switch >= 1", field="dirichlet_alpha")


def synthetic_cluster(num_gpus: int, seed: int = 0, config: SyntheticClusterConfig | None = None) -> ClusterSpec:
    if not isinstance(num_gpus, int) or isinstance(num_gpus, bool) or num_gpus < 1:
        raise InputError(f"must be a positive integer, got {num_gpus!r}", field="num_gpus")
    cfg = config or SyntheticClusterConfig()
    rng = np.random.default_rng([seed, num_gpus, 0xC1])
    pool = list(cfg.gpu_types)
    k = int(rng.integers(min(cfg.min_types, len(pool)), min(cfg.max_types, len(pool)) + 1))
    types = [pool[i] for i in sorted(rng.choice(len(pool), size=k, replace=False))]
    per_node = {t: GPU_TYPES[t].default_gpus_per_node for t in types}
    shares = rng.dirichlet([cfg.dirichlet_alpha] * k)
    groups: list[NodeGroup] = []
    left = num_gpus
    for t, share in zip(types, shares):
        nodes = int(share * num_gpus) // per_node[t]
        nodes = min(nodes, left // per_node[t])
        if nodes:
            groups.append(NodeGroup(t, nodes, per_node[t],
                                    cfg.nodes_per_switch if nodes > cfg.nodes_per_switch else None))
            left -= nodes * per_node[t]
    # the remainder: full nodes of the first type, then partially populated nodes
    t = types[0]
    nodes = left // per_node[t]
    if nodes:
        groups.append(NodeGroup(t, nodes, per_node[t], cfg.nodes_per_switch if nodes > cfg.nodes_per_switch else None))
        left -= nodes * per_node[t]
    size = 1 << max(left.bit_length() - 1, 0)
    while left:
        if size <= left:
            groups.append(NodeGroup(t, 1, size))
            left -= size
        size //= 2
    merged: dict[tuple, int] = {}
    for g in groups:           # merge equal (type, gpus per node, switch size) groups
        key = (g.gpu_type, g.gpus_per_node)
        merged[key] = merged.get(key, 0) + g.num_nodes
    out = tuple(NodeGroup(t, n, g, cfg.nodes_per_switch if n > cfg.nodes_per_switch else None)
                for (t, g), n in merged.items())
    spec = ClusterSpec(out, f"synthetic-{num_gpus}-seed{seed}")
    assert spec.num_gpus == num_gpus
    return spec


DEFAULT_GPU_COUNT_WEIGHTS = ((1, 0.05), (2, 0.15), (4, 0.35), (8, 0.30), (16, 0.15))


@dataclass(frozen=True)
class SyntheticJobsConfig:
    mean_interarrival_s: float = 120.0
    duration_median_s: float = 2 * 3600.0
    duration_sigma: float = 1.0               # of the log of the duration
    min_duration_s: float = 300.0
    max_duration_s: float = 7 * 24 * 3600.0
    gpu_count_weights: tuple[tuple[int, float], ...] = DEFAULT_GPU_COUNT_WEIGHTS
    deadline_fraction: float = 0.3
    deadline_slack_range: tuple[float, float] = (1.5, 4.0)
    num_tenants: int = 8

    def __post_init__(self):
        for f in ("mean_interarrival_s", "duration_median_s", "min_duration_s", "max_duration_s"):
            check_time(getattr(self, f), field=f, strict_min=True)
        if not self.min_duration_s <= self.max_duration_s:
            raise InputError("min_duration_s must be <= max_duration_s", field="min_duration_s")
        if not (math.isfinite(self.duration_sigma) and self.duration_sigma >= 0):
            raise InputError("must be >= 0", field="duration_sigma")
        if not self.gpu_count_weights or any(n < 1 or w < 0 for n, w in self.gpu_count_weights) \
                or sum(w for _, w in self.gpu_count_weights) <= 0:
            raise InputError("need (GPU count >= 1, weight >= 0) pairs with a positive total",
                             field="gpu_count_weights")
        if not 0 <= self.deadline_fraction <= 1:
            raise InputError("must be in [0, 1]", field="deadline_fraction")
        lo, hi = self.deadline_slack_range
        if not 1 <= lo <= hi:
            raise InputError("need 1 <= low <= high", field="deadline_slack_range")
        if self.num_tenants < 1:
            raise InputError("must be >= 1", field="num_tenants")


@lru_cache(maxsize=1)
def _pair_weights() -> tuple[tuple[tuple[str, int], ...], np.ndarray]:
    """(model, batch) pairs of the measured table, weighted by Arena's Philly trace mix."""
    from .measurements import load_measured_iter_times
    from .traces import load_bundled_trace
    pairs = sorted({(r.model, r.global_batch) for r in load_measured_iter_times()})
    counts = Counter((j.model, j.global_batch) for j in load_bundled_trace("arena-philly"))
    w = np.array([counts.get(p, 0) + 1.0 for p in pairs])     # +1: every measured pair possible
    return tuple(pairs), w / w.sum()


def synthetic_jobs(num_jobs: int, seed: int = 0, *, cluster: ClusterSpec | None = None,
                   oracle=None, config: SyntheticJobsConfig | None = None) -> tuple[Job, ...]:
    from .oracle import TableOracle
    from .traces import ARENA_GPU_TYPES, compact_shape

    if not isinstance(num_jobs, int) or isinstance(num_jobs, bool) or num_jobs < 0:
        raise InputError(f"must be a non-negative integer, got {num_jobs!r}", field="num_jobs")
    cfg = config or SyntheticJobsConfig()
    oracle = oracle if oracle is not None else TableOracle()
    rng = np.random.default_rng([seed, num_jobs, 0x10B5])
    if cluster is not None:
        by_type = cluster.gpus_by_type()
        per_node = {t: cluster.max_gpus_per_node(t) for t in by_type}
    else:
        by_type = {t: 10**9 for t in ARENA_GPU_TYPES}
        per_node = {t: GPU_TYPES[t].default_gpus_per_node for t in ARENA_GPU_TYPES}
    types = sorted(by_type)
    counts = np.array([n for n, _ in cfg.gpu_count_weights])
    cw = np.array([w for _, w in cfg.gpu_count_weights], dtype=float)
    max_type = max(by_type.values())
    ok = counts <= max_type
    if not ok.any():
        raise InputError(f"no GPU count of {list(counts)} fits the cluster", field="gpu_count_weights")
    counts, cw = counts[ok], cw[ok] / cw[ok].sum()
    pairs, pw = _pair_weights()

    feasible: dict[tuple[str, int], tuple[list, np.ndarray]] = {}

    def options(t: str, n: int):
        if (t, n) not in feasible:
            shape = compact_shape(t, n, per_node[t])
            idx, times = [], []
            for i, (m, b) in enumerate(pairs):
                it = oracle.iteration_time(m, b, shape)
                if it is not None:
                    idx.append(i)
                    times.append(it)
            w = pw[idx] if idx else np.array([])
            feasible[(t, n)] = ([(pairs[i], it) for i, it in zip(idx, times)],
                                np.cumsum(w) / w.sum() if idx else w)
        return feasible[(t, n)]

    gaps = rng.exponential(cfg.mean_interarrival_s, size=num_jobs)
    arrivals = np.cumsum(gaps) - (gaps[0] if num_jobs else 0.0)
    n_draw = rng.choice(len(counts), size=num_jobs, p=cw)
    u_type, u_pair, u_tenant = rng.random(num_jobs), rng.random(num_jobs), rng.random(num_jobs)
    durations = np.clip(cfg.duration_median_s * np.exp(cfg.duration_sigma * rng.standard_normal(num_jobs)),
                        cfg.min_duration_s, cfg.max_duration_s)
    has_deadline = rng.random(num_jobs) < cfg.deadline_fraction
    slack = rng.uniform(*cfg.deadline_slack_range, size=num_jobs)
    tenant_w = 1.0 / np.arange(1, cfg.num_tenants + 1)
    tenant_cdf = np.cumsum(tenant_w) / tenant_w.sum()
    type_tot = np.array([by_type[t] for t in types], dtype=float)

    jobs = []
    for i in range(num_jobs):
        n = int(counts[n_draw[i]])
        chosen = None
        while chosen is None:
            eligible = type_tot >= n
            cdf = np.cumsum(np.where(eligible, type_tot, 0.0))
            order = int(np.searchsorted(cdf / cdf[-1], u_type[i], side="right"))
            order = min(order, len(types) - 1)
            for k in range(len(types)):          # first the drawn type, then the next ones
                t = types[(order + k) % len(types)]
                if not eligible[(order + k) % len(types)]:
                    continue
                opts, cdf_p = options(t, n)
                if opts:
                    j = min(int(np.searchsorted(cdf_p, u_pair[i], side="right")), len(opts) - 1)
                    chosen = (t, opts[j])
                    break
            if chosen is None:
                if 2 * n > max_type:
                    raise InputError(f"no measured model fits any GPU count up to {n} on this cluster",
                                     field="cluster")
                n *= 2                           # nothing fits: ask for more GPUs
        t, ((model, batch), it) = chosen
        arrival = float(arrivals[i])
        dur = float(durations[i])
        deadline = arrival + float(slack[i]) * dur if has_deadline[i] else None
        tenant = int(np.searchsorted(tenant_cdf, u_tenant[i], side="right"))
        jobs.append(Job(f"syn-{i:06d}", model, batch, max(1, round(dur / it)), arrival, deadline,
                        tenant=f"tenant-{min(tenant, cfg.num_tenants - 1)}",
                        requested_gpu_type=t, requested_gpus=n))
    return tuple(jobs)
