"""A lower bound on every job's completion time: the job alone on the cluster.

``jct_lower_bounds`` gives, per job, the JCT it would have if it had the whole cluster
to itself::

    bound_j = (first round at or after its arrival - arrival)
              + iterations_j x min over shapes of the truth's iteration time

The shapes are those a policy can give it: every shape of the cluster with a
power-of-two GPU count up to ``max_gpus`` and power-of-two GPUs per node (the shapes of
the engine's candidate grids, ``ClusterSpec.shapes``; the optimizing policies'
``max_gpus`` defaults to 16), and the job's requested GPU count on its requested type in
the fewest nodes (what ``fcfs`` runs; ties between shapes go to the fewest nodes).
Rounds are at ``t0 + k x round_interval_s``, ``t0`` the first arrival, as in the
simulator. Nothing is charged for queueing, launching or
moving, and the truth is taken without the simulator's iteration noise; so with that
noise off (``simulate(..., iteration_noise_cv=0)``) no policy finishes a job earlier
than its bound (tested). With the noise on, a short job can beat it by the noise.
An oracle whose rates change as a job progresses (the Sia artifact's goodput jobs,
instances/goodput.py) gives the whole run's time on a shape itself (``run_time``).

What it is for: how far a schedule is from running every job alone at its fastest (the
ratio of average JCT to average bound), and, per class of job length, where a policy's
gain over another comes from (``arena bench bound``, ``engine/cli/commands/bench/bound.py``;
``arena bench policies`` adds the ratio to every row). It is not an achievable target:
jobs share the cluster.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .cluster import ClusterSpec
from .grid import Shape, pow2_upto
from .jobs import Job
from .oracle import Oracle


def cluster_shapes(cluster: ClusterSpec, max_gpus: int) -> list[Shape]:
    """The engine's candidate shapes (``ClusterSpec.shapes``) of power-of-two counts up to
    ``max_gpus``."""
    if max_gpus < 1:
        raise ValueError(f"max_gpus must be >= 1, got {max_gpus}")
    return cluster.shapes(pow2_upto(max_gpus))


@dataclass(frozen=True)
class JctBound:
    job_id: str
    bound_s: float            # inf: no shape runs the job
    fastest: Shape | None     # the shape the bound runs it on
    wait_s: float             # to the first round at or after its arrival


def jct_lower_bounds(jobs: tuple[Job, ...] | list[Job], cluster: ClusterSpec, oracle: Oracle, *,
                     round_interval_s: float, max_gpus: int = 16) -> list[JctBound]:
    """Per job, in the order given: its JCT alone on the cluster (module doc)."""
    if not round_interval_s > 0:
        raise ValueError(f"round_interval_s must be > 0, got {round_interval_s}")
    shapes = cluster_shapes(cluster, max_gpus)
    t0 = min((j.arrival_s for j in jobs), default=0.0)
    out = []
    for job in jobs:
        best_t, best_s = math.inf, None
        req = (cluster.fewest_nodes_shape(job.requested_gpu_type, job.requested_gpus)
               if job.requested_gpu_type and job.requested_gpus else None)
        run_time = getattr(oracle, "run_time", None)
        for shape in shapes + ([req] if req is not None and req not in shapes else []):
            if run_time is not None:                          # per iteration: the whole run's mean
                total = run_time(job, shape)
                t = None if total is None else total / job.num_iterations
            else:
                t = oracle.true_iteration_time(job, shape)
            if t is None:
                continue
            if t < best_t or (t == best_t and best_s is not None and shape.num_nodes < best_s.num_nodes):
                best_t, best_s = t, shape                     # ties: the fewest nodes
        k = math.ceil((job.arrival_s - t0) / round_interval_s - 1e-9)
        wait = t0 + k * round_interval_s - job.arrival_s
        out.append(JctBound(job.job_id, wait + job.num_iterations * best_t if best_s else math.inf, best_s, wait))
    return out
