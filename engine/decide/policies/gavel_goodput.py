"""``gavel`` on the Sia artifact's goodput jobs: Gavel (Narayanan et al., OSDI'20) as Sia's
comparison ran it ("Gavel+TunedJobs": ``gavel.py`` of the artifact with its default
``max_sum_throughput_perf`` and 360 s rounds). ``gavel`` and ``gavel-ap`` decide with it
when every job of a round is a goodput job (engine/decide/policies/gavel.py).

What it knows: no job's length; each job's true throughput per GPU type at its workload
batch, from the profiles.

Every job keeps its workload's GPU count and global batch (no batch adaptation; the
truth still counts its progress in goodput at that batch). Every ``round_s`` seconds:

1. throughput of each job on each GPU type: iterations per second at its batch on its
   GPU count packed into whole nodes plus a remainder (the artifact's
   ``predict_throughput``: one GPU always accumulates at least once), times the
   calibration factor; a count larger than the type gets 0.1;
2. the LP ``max sum_jt thr_jt x_jt`` over time fractions, ``sum_t x_jt <= 1``,
   ``sum_j count_j x_jt <= GPUs of t`` (HiGHS). The artifact solves it with ECOS, an
   interior-point method, whose answer shares a tie equally between identical jobs; a
   vertex solver gives the whole share to one of them. ``share_ties=true`` averages the
   fractions of jobs with identical throughput rows and counts (an optimal solution
   too); the default keeps HiGHS's vertex, which came closer to the artifact's own runs
   on the 8 Philly workloads (average JCT -6% against +16% with ties shared:
   docs/results/2026-12-04-sia-fidelity.md);
3. priorities ``x_jt / (time job j had on t / time all jobs had on t)`` (a new job
   starts with half a round on every type), jobs taken in decreasing priority (then
   allocation; ties in type order, then arrival) while their count fits what is left
   of the type;
4. every job run this round is credited a round on its type.

Between decisions every job keeps what it holds (the GPUs of a job that finished stay
idle until the next decision, as in the artifact). Placement: goodput_rounds.place (a
count that is not a whole number of nodes is placed on equal shares of the fewest
nodes that fit, e.g. 6 GPUs as 3 x 2 on 4-GPU nodes; the artifact fills node by node).

What differs from the artifact, with its measured effect (the 8 Philly workloads,
docs/results/2026-12-04-sia-fidelity.md): the LP's solver (above: HiGHS's vertex, average
JCT 6.4% below the artifact's Gavel; with ``share_ties=true`` 15.1% above), and
the symmetric placement and the goodput model's perfect profiling (not measured apart:
included in those figures).
"""
from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from engine.core.context import Decisions, DecisionStats, RoundContext
from engine.core.placement import Placer
from engine.core.policy import Policy, Workload, refuse_unknown_options
from instances.errors import InputError
from instances.goodput import EPS, BatchPlan
from instances.grid import Shape
from instances.limits import GAVEL_ROUND

from .goodput_rounds import goodput_model, job_of, place, progress_of, quiet_stdout

OPTIONS = ("round_s", "share_ties")
GAVEL_ROUND_S = 360.0
NO_FIT_THROUGHPUT = 0.1           # the artifact's throughput of a job on a type too small for it


def _cap_placement(count: int, gpn: int) -> tuple[int, ...]:
    p: tuple[int, ...] = ()
    while sum(p) < count:
        p = (*p, min(count - sum(p), gpn))
    return p


def gang_shapes(gpu_type: str, count: int, gpn: int) -> list[Shape]:
    """Equal shares of ``count`` GPUs over the fewest nodes first (then more nodes)."""
    out = []
    for k in range(1, count + 1):
        if count % k == 0 and count // k <= gpn:
            out.append(Shape(gpu_type, k, count // k))
    return out


HELD = "held: between Gavel's rounds"     # DecisionStats.message of a round Gavel does not decide


class GavelGoodput(Policy):
    """Gavel's max-sum-throughput LP and round-based time sharing (module doc)."""

    def __init__(self, name: str = "gavel", **cfg: Any):
        refuse_unknown_options(name, cfg, OPTIONS, scope=" for goodput jobs")
        self.name = name
        self.round_s = GAVEL_ROUND.check(cfg["round_s"], field="round_s", what=f"policy {name!r}: round_s ") \
            if "round_s" in cfg else GAVEL_ROUND_S
        share = str(cfg.get("share_ties", "false")).strip().lower()
        if share not in ("true", "false", "1", "0", "yes", "no"):
            raise InputError(f"policy {name!r}: share_ties must be true or false", field="share_ties")
        self.share_ties = share in ("true", "1", "yes")
        self._last: float | None = None
        self._job_time: dict[str, dict[str, float]] = {}
        self._cluster_time: dict[str, float] = {}
        self._placer: Placer | None = None

    def check_workload(self, workload: Workload) -> None:
        """A round longer than the run may sit idle with jobs queued would end it as stalled
        while Gavel holds them for its next round: refused, saying the longest that fits."""
        limit = workload.idle_limit_s
        if limit is not None and self.round_s > limit:
            raise InputError(f"policy {self.name!r}: round_s {self.round_s:g} s is longer than the {limit:g} s a run "
                             f"of {workload.name} waits with jobs queued and nothing running before it stops as "
                             f"stalled: jobs queued while Gavel holds its round would never start; give at most "
                             f"{limit:g} s (or a longer --round-interval)", field="round_s")

    def decide(self, ctx: RoundContext) -> Decisions:
        if self._last is not None and ctx.now_s < self._last + self.round_s - 1e-6:
            return _hold(ctx)
        t0 = time.perf_counter()
        self._last = ctx.now_s if self._last is None else self._last + self.round_s * math.floor(
            (ctx.now_s - self._last) / self.round_s + 1e-9)
        model = goodput_model(ctx)
        world = model.world
        types = [g.gpu_type for g in ctx.cluster.groups]
        types = list(dict.fromkeys(types))
        gpn = {g.gpu_type: g.gpus_per_node for g in ctx.cluster.groups}
        workers = {t: 0 for t in types}
        for node in ctx.cluster.nodes():
            if node.node_id not in ctx.unavailable_nodes:
                workers[node.gpu_type] += node.num_gpus
        views = list(ctx.jobs)
        for v in views:                                   # a new job: half a round on every type
            if v.job_id not in self._job_time:
                self._job_time[v.job_id] = {t: self.round_s / 2 for t in types}
                for t in types:
                    self._cluster_time[t] = self._cluster_time.get(t, 0.0) + self.round_s / 2
        thr = np.zeros((len(views), len(types)))
        count = np.zeros(len(views))
        for j, v in enumerate(views):
            job = job_of(v)
            count[j] = job.requested_gpus or 1
            for i, t in enumerate(types):
                thr[j, i] = self._throughput(world, job, t, int(count[j]), gpn[t], workers[t], progress_of(v))
        x = self._lp(thr, count, np.array([workers[t] for t in types], dtype=float))
        if self.share_ties and len(views) > 1:
            x = _share_ties(x, thr, count)
        entries = []
        for i, t in enumerate(types):
            ct = self._cluster_time.get(t, 0.0)
            for j, v in enumerate(views):
                frac = self._job_time[v.job_id][t] / ct if ct > 0 else 0.0
                a = x[j, i]
                prio = 0.0 if a == 0 else (a / frac if frac > 0 else a * 1e9)
                entries.append((prio, 0.0, a, len(entries), j, t))
        entries.sort(key=lambda e: (-e[0], -e[1], -e[2], e[3]))
        left = dict(workers)
        wanted: dict[str, Shape] = {}
        shapes_of: dict[str, list[Shape]] = {}
        for _, _, _, _, j, t in entries:
            jid = views[j].job_id
            c = int(count[j])
            if jid in wanted or left[t] == 0 or c > left[t]:
                continue
            left[t] -= c
            cands = gang_shapes(t, c, gpn[t])
            if not cands:
                left[t] += c
                continue
            wanted[jid] = cands[0]
            shapes_of[jid] = cands
        plans = {v.job_id: BatchPlan(fixed=job_of(v).requested_batch) for v in views if v.job_id in wanted}
        if self._placer is None or self._placer.spec is not ctx.cluster:
            self._placer = Placer(ctx.cluster)
        dec = place(ctx, self._placer, wanted, plans, [v.job_id for v in views], shapes_of)
        for jid, g in dec.grids.items():
            self._job_time[jid][g.gpu_type] += self.round_s
            self._cluster_time[g.gpu_type] += self.round_s
        stats = DecisionStats(jobs=len(views), decide_time_s=time.perf_counter() - t0,
                              placement_dropped=tuple(j for j in wanted if j not in dec.grids))
        return Decisions(grids=dec.grids, placements=dec.placements, plans=dec.plans, stats=stats)

    @staticmethod
    def _throughput(world, job, t: str, count: int, gpn: int, workers: int, progress: float) -> float:
        if count > workers:
            return NO_FIT_THROUGHPUT
        app = world.on(job.application, t)
        placement = _cap_placement(count, gpn)
        local = math.ceil(job.requested_batch / count - EPS)
        max_local = app.max_local_for(placement)
        if max_local is None:
            return 0.0
        accum = math.ceil(local / max_local - EPS) - 1
        if count == 1:
            accum = max(1, accum)
        atomic = math.ceil(local / (accum + 1) - EPS)
        atomic = min(atomic, int(app.max_batch / (count * (accum + 1))))
        it = app.iteration_time(placement, atomic, accum) if atomic >= 1 else None
        return 0.0 if it is None or not it > 0 else app.calibration / it

    @staticmethod
    def _lp(thr: np.ndarray, count: np.ndarray, workers: np.ndarray) -> np.ndarray:
        from scipy.optimize import linprog
        m, n = thr.shape
        if m == 0:
            return thr
        a_ub = np.zeros((m + n, m * n))
        for j in range(m):
            a_ub[j, j * n:(j + 1) * n] = 1.0
            for i in range(n):
                a_ub[m + i, j * n + i] = count[j]
        b_ub = np.concatenate([np.ones(m), workers])
        with quiet_stdout():
            res = linprog(-thr.reshape(-1), A_ub=a_ub, b_ub=b_ub, bounds=(0, 1), method="highs")
        if res.x is None:
            raise RuntimeError(f"gavel: the allocation LP failed ({res.message})")
        return np.clip(np.round(res.x.reshape(m, n), 5), 0.0, 1.0)


def _share_ties(x: np.ndarray, thr: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Average the fractions of jobs with identical throughput rows and counts."""
    groups: dict[tuple, list[int]] = {}
    for j in range(len(count)):
        groups.setdefault((count[j], *np.round(thr[j], 12).tolist()), []).append(j)
    out = x.copy()
    for members in groups.values():
        if len(members) > 1:
            out[members] = np.round(x[members].mean(axis=0), 5)
    return out


def _hold(ctx: RoundContext) -> Decisions:
    """Between decisions: every running job keeps its allocation (and plan), nobody starts."""
    grids = {v.job_id: v.current.grid for v in ctx.jobs if v.current is not None}
    pins = {v.job_id: v.current.gpus for v in ctx.jobs if v.current is not None}
    plans = {v.job_id: BatchPlan(fixed=job_of(v).requested_batch) for v in ctx.jobs if v.current is not None}
    return Decisions(grids=grids, placements=pins, plans=plans, stats=DecisionStats(message=HELD))
