"""What the goodput-aware baselines share on the Sia artifact's instances (``sia:``,
instances/goodput.py): their candidate configurations, what each job has been seen to
run on, its restart state, and placement of the chosen configurations on GPUs.

Configurations are the artifact's (``CONFIGS_4GPU`` / ``CONFIGS_8GPU`` of its policies):
1, 2, 4 ... GPUs up to a node on one node, then whole nodes (2, 3 ... nodes), up to 64
GPUs and at most the GPU cluster's nodes and its ``cluster_max_physical_nnodes``.
Placement keeps a job whose configuration is unchanged on its GPUs, then places the
largest configurations first with the engine's placer; a one-node configuration that
finds no node with room is spread symmetrically over 2, 4 ... nodes (as the artifact's
placer spreads it over the GPUs left), and a job that still does not fit waits.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from engine.core.context import Decisions, GpuId, JobView, RoundContext
from engine.core.placement import Placer
from instances.errors import InputError
from instances.goodput import ADAPTIVE, BatchPlan, GoodputJob, is_goodput, placement_of
from instances.grid import Grid, Shape

MAX_CONFIG_GPUS = 64


def goodput_round(ctx: RoundContext) -> bool:
    """Whether the round's jobs are goodput jobs (all of them); mixed kinds are refused."""
    kinds = {is_goodput(v.job) for v in ctx.jobs}
    if len(kinds) > 1:
        raise InputError("a round mixes the Sia artifact's goodput jobs with fixed-batch jobs; policies decide for "
                         "one kind at a time", field="--instance")
    return kinds == {True}


def goodput_model(ctx: RoundContext):
    """The round's goodput estimates (``estimators.goodput.GoodputModel``)."""
    perf = ctx.perf
    if perf is None or not callable(getattr(perf, "goodput", None)):
        raise InputError("goodput jobs need the goodput model (estimators.goodput.GoodputModel) to decide with; "
                         f"got {getattr(perf, 'name', perf)!r}", field="--perf")
    return perf


def sia_configs(ctx: RoundContext, max_physical_nodes: dict[str, int] | None = None) -> dict[str, list[Shape]]:
    """Per GPU type, the artifact's configurations as shapes, in its order."""
    nodes_of: dict[str, list[int]] = {}
    for g in ctx.cluster.groups:
        nodes_of.setdefault(g.gpu_type, []).extend([g.gpus_per_node] * g.num_nodes)
    out: dict[str, list[Shape]] = {}
    for t, sizes in nodes_of.items():
        gpn = max(sizes)
        n_nodes = len(sizes)
        if max_physical_nodes and t in max_physical_nodes:
            n_nodes = min(n_nodes, max_physical_nodes[t])
        shapes, g = [], 1
        while g < gpn:
            shapes.append(Shape(t, 1, g))
            g *= 2
        shapes.extend(Shape(t, k, gpn) for k in range(1, n_nodes + 1) if k * gpn <= MAX_CONFIG_GPUS)
        out[t] = shapes
    return out


def progress_of(view: JobView) -> float:
    return max(0.0, float(view.job.num_iterations) - float(view.remaining_iterations))


def in_restart(view: JobView, now: float) -> bool:
    """Whether a running job is still in its restart downtime (it holds GPUs, computes nothing)."""
    if view.current is None or view.last_change is None:
        return False
    restart = getattr(view.job, "restart_s", 0.0)
    return now < view.last_change.changed_at_s + restart


@dataclass
class JobRecord:
    """What a policy has seen of one job over the rounds."""
    profiled: dict[str, int] = field(default_factory=dict)   # GPU type -> most replicas it computed on
    restarts: int = 0
    # GPU type -> {(nodes, replicas, per-GPU batch): (step s, all-reduce s)} it ran at, and
    # the gradient statistics (sqr, var) it last measured (recorded when ``Seen`` has a world)
    points: dict[str, dict[tuple[int, int, int], tuple[float, float]]] = field(default_factory=dict)
    grad: tuple[float, float] | None = None
    # the same points whatever the GPU type, the first measured at each (nodes, replicas,
    # per-GPU batch) kept: what a heterogeneity-unaware job's profile holds (the artifact's)
    blind: dict[tuple[int, int, int], tuple[float, float]] = field(default_factory=dict)


class Seen:
    """Per job: the GPU types and replica counts it has computed on (a running job that
    is past its restart has run on its shape since the last round)."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobRecord] = {}

    def update(self, ctx: RoundContext, world=None) -> None:
        """Record the shapes running jobs computed on since the last round; with ``world``
        (``SiaWorld``) also what they measured there: step times at the per-GPU batch they
        chose and their gradient statistics."""
        active = set()
        for v in ctx.jobs:
            active.add(v.job_id)
            rec = self.jobs.setdefault(v.job_id, JobRecord())
            if v.current is not None and v.last_change is not None and \
                    ctx.now_s > v.last_change.changed_at_s + getattr(v.job, "restart_s", 0.0):
                t = v.current.grid.gpu_type
                rec.profiled[t] = max(rec.profiled.get(t, 0), v.current.grid.num_gpus)
                if world is not None:
                    self._measure(world, v, rec)
        for jid in [j for j in self.jobs if j not in active]:
            del self.jobs[jid]

    @staticmethod
    def _measure(world, v: JobView, rec: JobRecord) -> None:
        job = job_of(v)
        shape = v.current.grid.shape
        app = world.on(job.application, shape.gpu_type)
        epoch = app.curves.epoch_of(progress_of(v))
        placement = placement_of(shape)
        cfg = app.configure(placement, ADAPTIVE, epoch)
        if cfg is None:
            return
        ss = app.step_sync(placement, cfg[0])
        if ss is not None:
            rec.points.setdefault(shape.gpu_type, {})[(shape.num_nodes, shape.num_gpus, cfg[0])] = ss
            rec.blind.setdefault((shape.num_nodes, shape.num_gpus, cfg[0]), ss)
        rec.grad = app.curves.grad_stats(sum(placement) * cfg[0] * (cfg[1] + 1), epoch)


@contextmanager
def quiet_stdout():
    """The process's stdout file descriptor sent to /dev/null: HiGHS's C++ code (through
    SciPy) prints notes there, and stdout carries tables and ``--json`` output."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:                 # no stdout file descriptor: nothing to protect
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


def free_gpus(ctx: RoundContext, types: list[str]) -> dict[str, int]:
    """GPUs per type on the nodes in service."""
    free = {t: 0 for t in types}
    for node in ctx.cluster.nodes():
        if node.node_id not in ctx.unavailable_nodes and node.gpu_type in free:
            free[node.gpu_type] += node.num_gpus
    return free


def solve_assignment(n_jobs: int, types: list[str], cols: list[tuple[int, str, Shape]], cost: np.ndarray,
                     pinned: list[int], free: dict[str, int], time_limit_s: float, rel_gap: float,
                     policy: str) -> list[int]:
    """The columns chosen by ``min cost @ x`` over binary x, at most one column per job,
    the GPUs of each type at most ``free``, the ``pinned`` columns at 1 (HiGHS, SciPy)."""
    if not cols:
        return []
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix
    n = len(cols)
    tindex = {t: i for i, t in enumerate(types)}
    rows = [j for j, _, _ in cols] + [n_jobs + tindex[t] for _, t, _ in cols]
    vals = [1.0] * n + [float(s.num_gpus) for _, _, s in cols]
    a = coo_matrix((vals, (rows, list(range(n)) * 2)), shape=(n_jobs + len(types), n)).tocsr()
    ub = np.concatenate([np.ones(n_jobs), [free[t] for t in types]])
    lo = np.zeros(n)
    lo[pinned] = 1.0
    with quiet_stdout():
        res = milp(cost, integrality=np.ones(n), bounds=Bounds(lo, np.ones(n)),
                   constraints=[LinearConstraint(a, -np.inf, ub)],
                   options={"time_limit": time_limit_s, "mip_rel_gap": rel_gap})
    if res.x is None:
        raise RuntimeError(f"policy {policy!r}: the assignment MILP found no solution ({res.message})")
    return [k for k in range(n) if res.x[k] > 0.5]


def place(ctx: RoundContext, placer: Placer, wanted: dict[str, Shape], plans: dict[str, BatchPlan],
          order: list[str], alternatives: dict[str, list[Shape]] | None = None) -> Decisions:
    """Grids and pinned GPUs for the wanted shapes (module doc); ``order``: who is placed
    first among equal sizes; ``alternatives``: per job, the shapes to try in turn (default:
    the wanted one, then its symmetric spreads)."""
    free = placer.empty_free_map(ctx.unavailable_nodes)
    views = {v.job_id: v for v in ctx.jobs}
    grids: dict[str, Grid] = {}
    pins: dict[str, tuple[GpuId, ...]] = {}
    rest = []
    for jid in order:
        if jid not in wanted:
            continue
        cur = views[jid].current
        same = cur is not None and (cur.grid.shape == wanted[jid] or (
            alternatives is not None and cur.grid.shape in alternatives.get(jid, ())))
        if cur is not None and same and not cur.on_any(ctx.unavailable_nodes):
            placer.take(free, cur.gpus)
            grids[jid], pins[jid] = cur.grid, cur.gpus
        else:
            rest.append(jid)
    rank = {jid: i for i, jid in enumerate(order)}
    rest.sort(key=lambda j: (-wanted[j].num_gpus, rank[j]))
    for jid in rest:
        shape = wanted[jid]
        cur = views[jid].current
        prefer = cur.gpus if cur is not None else ()
        for s in (alternatives.get(jid) if alternatives and jid in alternatives else _spreads(shape)):
            gpus = placer.choose(free, s, prefer)
            if gpus is not None:
                placer.take(free, gpus)
                grids[jid], pins[jid] = Grid(s), gpus
                break
    return Decisions(grids=grids, placements=pins, plans={j: plans[j] for j in grids if j in plans})


def _spreads(shape: Shape) -> list[Shape]:
    """``shape``, then for a one-node shape the same GPUs over 2, 4 ... nodes."""
    out = [shape]
    if shape.num_nodes == 1:
        k = 2
        while k <= shape.gpus_per_node and shape.gpus_per_node % k == 0:
            out.append(Shape(shape.gpu_type, k, shape.gpus_per_node // k))
            k *= 2
    return out


def job_of(view: JobView) -> GoodputJob:
    job = view.job
    assert isinstance(job, GoodputJob)
    return job
