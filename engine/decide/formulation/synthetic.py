"""Synthetic rounds of Arena's shape, for solver benchmarks and property tests.

The cluster mixes four GPU types in the proportions of Arena's 1,280-GPU cluster
(A100 4/node, V100 16/node, A40 2/node, A10 2/node), scaled to ``num_gpus``. Each job
gets compact power-of-two shapes (1..16 GPUs) on every type plus one relaxed shape
(half the GPUs per node), with throughput = type speed x n ** alpha x per-job noise;
a per-job memory floor removes small counts. These coefficients are synthetic (their
only purpose is a model of realistic size and structure), not estimates of anything.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from .round_data import Capacity, RoundData

# (type, GPUs per node, share of the cluster's GPUs, relative speed) — synthetic only
SYNTHETIC_TYPES = (("a100", 4, 0.25, 1.0), ("v100", 16, 0.25, 0.45), ("a40", 2, 0.25, 0.5),
                   ("a10", 2, 0.25, 0.35))
COUNTS = (1, 2, 4, 8, 16)
ROUND_INTERVAL_S = 300.0
RECONFIG_S_PER_GPU = 150.0       # as the Arena artifact charged its baselines
RECONFIG_CAP_S = 600.0


def synthetic_capacity(num_gpus: int) -> Capacity:
    sizes = {}
    for t, gpn, share, _ in SYNTHETIC_TYPES:
        nodes = max(1, int(round(num_gpus * share / gpn)))
        sizes[t] = [gpn] * nodes
    return Capacity.from_node_sizes(sizes)


def _job_columns(seed: int, j: int, tindex: dict):
    """Columns of synthetic job ``j``: drawn from its own stream, so rounds that share a
    job agree on it."""
    rng = np.random.default_rng([seed, j])
    alpha = rng.uniform(0.55, 0.95)
    base = rng.lognormal(0.0, 0.5)
    min_gpus = int(rng.choice([1, 1, 2, 4]))
    want = max(int(rng.choice(COUNTS, p=[0.35, 0.25, 0.2, 0.15, 0.05])), min_gpus)
    cols = []           # (type index, nodes, gpn, throughput)
    ref_tp = None
    for t, gpn_max, _, speed in SYNTHETIC_TYPES:
        noise = rng.lognormal(0.0, 0.15)
        for n in COUNTS:
            if n < min_gpus:
                continue
            shapes = [(max(1, n // gpn_max), min(n, gpn_max), 1.0)]
            if n >= 2 and min(n, gpn_max) >= 2:
                m = min(n, gpn_max) // 2
                shapes.append((n // m, m, 0.9))
            for nodes, m, loc in shapes:
                tp = base * speed * noise * n ** alpha * loc
                cols.append((tindex[t], nodes, m, tp))
                if t == "a100" and n == want and loc == 1.0:
                    ref_tp = tp
    remaining = rng.lognormal(8.0, 1.2)
    running = rng.random()
    cur = int(rng.integers(len(cols)))
    queued_s = rng.exponential(3600.0)
    return cols, (ref_tp if ref_tp is not None else max(c[3] for c in cols)), want, remaining, running, cur, queued_s


def synthetic_round_data(num_gpus: int, num_jobs: int, seed: int = 0, running_fraction: float = 0.5,
                         round_index: int = 0, turnover: float = 0.05,
                         current: Mapping[str, int] | None = None,
                         reconfig_s_per_gpu: float = RECONFIG_S_PER_GPU,
                         reconfig_cap_s: float = RECONFIG_CAP_S) -> RoundData:
    """Round ``round_index`` of a synthetic sequence: jobs [r*s, r*s + num_jobs) of one
    population, s = turnover x num_jobs, so consecutive rounds share most of their jobs
    (what warm starts exploit); each job's work left shrinks by 2% per round.

    Without ``current``, a random ``running_fraction`` of the jobs runs on a random
    column each (not necessarily a feasible allocation: solver benchmarks only). With
    ``current`` (job id -> index of its running column among that job's columns, as
    ``local_columns`` reads them off a decision), exactly those jobs run there and the
    others are queued: a sequence of rounds that each start from the previous decision
    (jobs that left the window have finished, new ones have arrived queued). A move
    costs ``reconfig_s_per_gpu`` per GPU of the new column, at most ``reconfig_cap_s``."""
    cap = synthetic_capacity(num_gpus)
    tindex = {t: cap.types.index(t) for t, *_ in SYNTHETIC_TYPES}
    shift = max(1, int(round(turnover * num_jobs))) if round_index else 0
    first = round_index * shift
    c_job, c_type, c_nodes, c_gpn, c_tp, c_rc = [], [], [], [], [], []
    ref, cur, req, rem, queued = [], [], [], [], []
    for j in range(num_jobs):
        cols, ref_tp, want, remaining, running, cur_local, queued_s = _job_columns(seed, first + j, tindex)
        start = len(c_job)
        for ti, nodes, m, tp in cols:
            c_job.append(j); c_type.append(ti); c_nodes.append(nodes); c_gpn.append(m); c_tp.append(tp)
            c_rc.append(min(reconfig_cap_s, reconfig_s_per_gpu * nodes * m))
        ref.append(ref_tp)
        req.append(want)
        rem.append(remaining * 0.98 ** round_index)
        if current is not None:
            cur_local = current.get(f"j{first + j}", -1)
            is_running = 0 <= cur_local < len(cols)
        else:
            is_running = running < running_fraction
        cur.append(start + cur_local if is_running else -1)
        queued.append(0.0 if is_running else queued_s)
    cur = np.array(cur, dtype=np.int64)
    rc = np.array(c_rc)
    col_job = np.array(c_job, dtype=np.int64)
    stay = cur[col_job] == np.arange(len(col_job))
    rc[stay] = 0.0
    return RoundData(
        now_s=round_index * ROUND_INTERVAL_S, round_interval_s=ROUND_INTERVAL_S, capacity=cap,
        job_ids=tuple(f"j{first + j}" for j in range(num_jobs)), remaining_iterations=np.array(rem),
        ref_throughput=np.array(ref), global_batch=np.full(num_jobs, 1.0), current_col=cur,
        running=cur >= 0, queued_s=np.array(queued),
        deadline_s=np.full(num_jobs, np.inf), priority=np.ones(num_jobs),
        tenants=tuple("default" for _ in range(num_jobs)), requested_gpus=np.array(req, dtype=np.int64),
        requested_type=tuple("a100" for _ in range(num_jobs)), col_job=col_job,
        col_type=np.array(c_type, dtype=np.int64), col_nodes=np.array(c_nodes, dtype=np.int64),
        col_gpn=np.array(c_gpn, dtype=np.int64), col_pp=np.ones(len(c_job), dtype=np.int64),
        col_throughput=np.array(c_tp), col_reconfig_s=rc, grids=(), plans=(),
        attained_gpu_s=np.zeros(num_jobs), arrival_s=np.zeros(num_jobs))


def local_columns(data: RoundData, chosen: np.ndarray) -> dict[str, int]:
    """Job id -> index of its chosen column among the job's own columns, from the
    chosen column indices of ``data`` (the ``current`` of the next synthetic round)."""
    starts = np.searchsorted(data.col_job, np.arange(data.n_jobs))
    chosen = np.asarray(chosen, dtype=np.int64)
    return {data.job_ids[j]: int(k - starts[j]) for j, k in zip(data.col_job[chosen].tolist(), chosen.tolist())}


def tiny_round_data(node_sizes: dict[str, list[int]], jobs: list[dict], *, now_s: float = 0.0,
                    round_interval_s: float = ROUND_INTERVAL_S) -> RoundData:
    """A hand-written round (tests, examples). Each job is a dict with ``cols``: a list of
    (gpu_type, nodes, gpus_per_node, throughput[, reconfig_s]) and optional ``remaining``
    (iterations, default 1000), ``ref`` (reference throughput, default the first
    column's), ``current`` (index into cols), ``deadline_s``, ``tenant``, ``attained_gpu_s``,
    ``queued_s``, ``priority``, ``id``."""
    cap = Capacity.from_node_sizes(node_sizes)
    c_job, c_type, c_nodes, c_gpn, c_tp, c_rc = [], [], [], [], [], []
    cur, ref = [], []
    for j, spec in enumerate(jobs):
        start = len(c_job)
        for col in spec["cols"]:
            t, n, m, tp = col[:4]
            c_job.append(j); c_type.append(cap.types.index(t)); c_nodes.append(n); c_gpn.append(m)
            c_tp.append(float(tp)); c_rc.append(float(col[4]) if len(col) > 4 else 0.0)
        cur.append(start + spec["current"] if spec.get("current") is not None else -1)
        ref.append(float(spec.get("ref", spec["cols"][0][3])))
    n = len(jobs)
    get = lambda key, default: np.array([float(s.get(key, default)) for s in jobs])  # noqa: E731
    cur = np.array(cur, dtype=np.int64)
    return RoundData(
        now_s=now_s, round_interval_s=round_interval_s, capacity=cap,
        job_ids=tuple(str(s.get("id", f"j{i}")) for i, s in enumerate(jobs)),
        remaining_iterations=get("remaining", 1000.0), ref_throughput=np.array(ref),
        global_batch=np.ones(n), current_col=cur, running=cur >= 0, queued_s=get("queued_s", 0.0),
        deadline_s=get("deadline_s", np.inf), priority=get("priority", 1.0),
        tenants=tuple(str(s.get("tenant", "default")) for s in jobs),
        requested_gpus=np.zeros(n, dtype=np.int64), requested_type=tuple(None for _ in jobs),
        col_job=np.array(c_job, dtype=np.int64), col_type=np.array(c_type, dtype=np.int64),
        col_nodes=np.array(c_nodes, dtype=np.int64), col_gpn=np.array(c_gpn, dtype=np.int64),
        col_pp=np.ones(len(c_job), dtype=np.int64), col_throughput=np.array(c_tp),
        col_reconfig_s=np.array(c_rc), grids=(), plans=(),
        attained_gpu_s=get("attained_gpu_s", 0.0), arrival_s=np.zeros(n))
