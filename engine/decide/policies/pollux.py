"""``pollux``: Pollux (Qiao et al., OSDI'21) as Sia's comparison ran it on its artifact's
goodput jobs (``multi_simulator_unaware.py --policy=pollux --policy_p_val=-1``, 60 s
rounds): heterogeneity-unaware. Only rounds of goodput jobs (``sia:`` instances) are
decided; Pollux's batch adaptation has no meaning for fixed-batch jobs.

What it knows: no job's length; the mean over GPU types of the job's goodput in the
profiles (``estimates=fitted``: Pollux's model fitted to what the job measured).

Pollux values an allocation by the job's speedup (its goodput over its goodput on a
fair share of the cluster, ``ceil(GPUs / jobs)`` GPUs), scaled by the job's dominant
share times the number of (4-GPU virtual) nodes, times the restart factor
``max(age - restarts x 30 s, 0) / (age + 30 s)`` for any change (a queued job's start
included), and maximizes their power mean with ``p = -1``. A job that has not run yet
has a linear speedup; a job may grow to at most twice the replicas it has run on (and
at most 16, the smallest GPU type's count, and the largest batch over the smallest
per-GPU batch). Unaware of GPU types, it believes a job runs equally fast on every
type: here its belief for a configuration is the mean over the GPU types of the job's
true goodput there (the artifact fits one throughput model to every run of the job,
whatever the type).

Search (option ``search``). ``exact`` (the default): maximizing the power mean with ``p <
0`` is minimizing ``sum_j (s_j + 1e-3) ** p``, separable per job over its candidate
configurations (one GPU type each: 1, 2, 4 GPUs on one node, then whole nodes, at most
16 GPUs), solved as one MILP (HiGHS) under the GPUs per type; an unscheduled job costs
``1e-3 ** p``; placement: goodput_rounds.place. ``ga``: the artifact's own search, a
genetic algorithm (NSGA-II, ``generations`` x ``population``, 100 x 100) over replicas
per 4-GPU virtual node (pollux_ga.py), after which a job's replicas on a second GPU type
are dropped (vnodes.py); a job's speedup on ``r`` replicas over ``n`` virtual nodes is
believed as ``r`` spread evenly over ``n``. Where that leaves an asymmetric placement
(3 + 1 GPUs), ours runs the largest symmetric part of it (3 on one node).

Belief (option ``estimates``). ``profiles`` (the default): the mean over the GPU types of
the job's true goodput there (perfect profiling). ``fitted``: Pollux's throughput model
fitted to every point the job measured, whatever the type (the first measurement at
each nodes x replicas x per-GPU batch kept), with the gradient statistics it last
measured, as the artifact's Pollux believes; a job without a measurement has a linear
speedup.

``pollux-artifact`` is ``search=ga, estimates=fitted``: the Pollux Sia was measured
against. Measured effect of each on the 8 Philly workloads (average JCT, mean over the
workloads; docs/results/2026-12-05-pollux-differences.md): ``pollux`` 0.80 h; with
``estimates=fitted`` 0.83 h (+4%); with ``search=ga`` 0.96 h (+20%: on workload 1 a
third of the GPUs the search gives are on a job's second type and dropped); both
(``pollux-artifact``) 0.97 h, against Table 3's 1.0 h and the artifact's own Pollux's
0.88 h on workload 1 (ours 0.82 h there). Not measured: our jobs choose their batch by
their true goodput (the artifact's unaware jobs choose it with their type-blind fitted
model). The symmetric rounding above drops 0.7% of the GPUs left (workload 1).
"""
from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from engine.core.context import Decisions, DecisionStats, RoundContext
from engine.core.placement import Placer
from engine.core.policy import Policy, Workload, refuse_unknown_options, register_policy
from instances.cluster import MAX_CLUSTER_GPUS
from instances.errors import InputError
from instances.goodput import ADAPTIVE, GoodputJob
from instances.grid import Shape
from instances.limits import GA_GENERATIONS, GA_MAX_EVALUATIONS, GA_POPULATION, POLLUX_P, Range

from .goodput_rounds import Seen, free_gpus, goodput_model, goodput_round, job_of, place, progress_of, solve_assignment
from .pollux_ga import GaProblem, search
from .sia_goodput import _bounded, _float
from .vnodes import VirtualNodes

OPTIONS = ("p", "restart_delay_s", "max_replicas", "max_replicas_factor", "time_limit_s", "rel_gap", "search",
           "generations", "population", "estimates")
SEARCHES = ("exact", "ga")
ESTIMATES = ("profiles", "fitted")
POLLUX_EPS = 1e-3                  # the artifact's offset of a speedup in the power mean
POLLUX_RESTART_S = 30.0            # the artifact's restart delay in the restart factor
VNODE_GPUS = 4                     # the artifact's virtual node (its smallest node size)
VNODE_MAX_NODES = 16               # the artifact's search: at most this many virtual nodes per job
# options each search reads alone (given with the other search: refused, not ignored)
SEARCH_KEYS = {"exact": ("time_limit_s", "rel_gap"), "ga": ("generations", "population")}
MAX_REPLICAS = Range(1, MAX_CLUSTER_GPUS, "a job's GPUs (instances.cluster.MAX_CLUSTER_GPUS)", integer=True)


def _num(policy: str, cfg: dict, key: str, default: float, lo: float, hi: float) -> float:
    v = _float(policy, cfg, key, default, lo, hi)
    assert v is not None                # a default is given
    return v


class Pollux(Policy):
    def __init__(self, name: str = "pollux", defaults: dict[str, Any] | None = None, /, **given: Any):
        refuse_unknown_options(name, {**(defaults or {}), **given}, OPTIONS)
        cfg = {**(defaults or {}), **given}
        self.name = name
        self.given = frozenset(given)               # what the user set (not the variant's defaults)
        p = _bounded(name, cfg, "p", POLLUX_P)
        self.p = -1.0 if p is None else p
        self.restart_s = _num(name, cfg, "restart_delay_s", POLLUX_RESTART_S, 0.0, 1e6)
        self.max_replicas = _bounded(name, cfg, "max_replicas", MAX_REPLICAS)
        self.factor = _num(name, cfg, "max_replicas_factor", 2.0, 0.0, 1e6)
        self.time_limit_s = _num(name, cfg, "time_limit_s", 60.0, 0.01, 1e6)
        self.rel_gap = _num(name, cfg, "rel_gap", 1e-4, 0.0, 1.0)
        self.search = str(cfg.get("search", "exact"))
        if self.search not in SEARCHES:
            raise InputError(f"policy {name!r}: search must be one of {', '.join(SEARCHES)}, got {self.search!r}",
                             field="search")
        self.generations = int(_bounded(name, cfg, "generations", GA_GENERATIONS) or 100)
        self.population = int(_bounded(name, cfg, "population", GA_POPULATION) or 100)
        if self.generations * self.population > GA_MAX_EVALUATIONS:
            raise InputError(f"policy {name!r}: generations x population is {self.generations * self.population:,} "
                             f"evaluations a round, more than {GA_MAX_EVALUATIONS:,} (ten times the artifact's 100 x "
                             "100: a round would take minutes)", field="population" if "population" in given
                             else "generations")
        unread = sorted(self.given & {k for s, keys in SEARCH_KEYS.items() if s != self.search for k in keys})
        if unread:
            raise InputError(f"policy {name!r}: option {unread[0]} is not read with search={self.search}; drop "
                             f"{', '.join(unread)}", field=unread[0])
        self.estimates = str(cfg.get("estimates", "profiles"))
        if self.estimates not in ESTIMATES:
            raise InputError(f"policy {name!r}: estimates must be one of {', '.join(ESTIMATES)}, got "
                             f"{self.estimates!r}", field="estimates")
        self._fits: dict[tuple[str, int], np.ndarray] = {}
        self._ga_last: tuple[list[str], list[tuple[int, int]], np.ndarray] | None = None
        self.seen = Seen()
        self._placer: Placer | None = None
        self._belief: dict = {}

    def check_workload(self, workload: Workload) -> None:
        """Pollux decides only goodput jobs: refused anywhere else, before any round."""
        if not workload.goodput:
            raise InputError(f"policy {self.name!r} decides only the Sia artifact's adaptive-batch goodput jobs "
                             f"(--instance sia:TRACE/WORKLOAD), not the fixed-batch jobs of {workload.name}",
                             field="--policy")

    def decide(self, ctx: RoundContext) -> Decisions:
        if not ctx.jobs:
            return Decisions(grids={})
        if not goodput_round(ctx):
            raise InputError(f"policy {self.name!r} decides only the Sia artifact's adaptive-batch goodput jobs "
                             "(--instance sia:TRACE/WORKLOAD)", field="--policy")
        t0 = time.perf_counter()
        self.seen.update(ctx, goodput_model(ctx).world if self.estimates == "fitted" else None)
        r = _Round(self, ctx)
        if self.search == "ga":
            dec, n_cols = self._decide_ga(ctx, r), 0
        else:
            dec, n_cols = self._decide_exact(ctx, r)
        stats = DecisionStats(jobs=len(r.views), columns=n_cols, decide_time_s=time.perf_counter() - t0,
                              placement_dropped=tuple(j for j in r.wanted if j not in dec.grids))
        return Decisions(grids=dec.grids, placements=dec.placements, plans=dec.plans, stats=stats)

    def _decide_exact(self, ctx: RoundContext, r: _Round) -> tuple[Decisions, int]:
        configs = {t: [s for s in self._configs(t, r.gpn[t]) if s.num_gpus <= r.cap] for t in r.types}
        cols: list[tuple[int, str, Shape]] = []
        cost: list[float] = []
        for j, v in enumerate(r.views):
            cur = v.current.grid if v.current is not None else None
            for t in r.types:
                for s in configs[t]:
                    if s.num_gpus > r.limit[j] and not (cur is not None and cur.shape == s):
                        continue
                    sp = r.speedup(j, s.num_gpus) * r.scale
                    if cur is None or cur.shape != s:
                        sp *= r.restart[j]
                    cols.append((j, t, s))
                    # the power mean is maximized: its sum of powers minimized for p < 0, maximized for p > 0
                    cost.append(math.copysign(1.0, -self.p) * ((sp + POLLUX_EPS) ** self.p - POLLUX_EPS ** self.p))
        chosen = solve_assignment(len(r.views), r.types, cols, np.array(cost), [], r.free, self.time_limit_s,
                                  self.rel_gap, self.name)
        r.wanted = {r.views[cols[k][0]].job_id: cols[k][2] for k in chosen}
        if self._placer is None or self._placer.spec is not ctx.cluster:
            self._placer = Placer(ctx.cluster)
        dec = place(ctx, self._placer, r.wanted, {jid: ADAPTIVE for jid in r.wanted}, [v.job_id for v in r.views])
        return dec, len(cols)

    def _decide_ga(self, ctx: RoundContext, r: _Round) -> Decisions:
        """The artifact's search (pollux_ga.py) over its virtual nodes, then its repair:
        a job's replicas on a second GPU type dropped, and here also the GPUs beyond the
        largest symmetric shape within what is left (our placements are symmetric)."""
        vn = VirtualNodes.of(ctx, VNODE_GPUS)
        order = sorted(range(len(r.views)), key=lambda j: (r.views[j].attained_gpu_s, job_of(r.views[j]).arrival_s))
        views = [r.views[j] for j in order]
        base = np.zeros((len(views), len(vn.keys)), dtype=np.int64)
        for i, v in enumerate(views):
            for gpu in (v.current.gpus if v.current is not None else ()):
                base[i, vn.index[vn.key_of(gpu)]] += 1
        max_rep = np.array([max(r.limit[j], int(base[i].sum())) for i, j in enumerate(order)])
        table = np.full((len(views), int(max_rep.max()) + 1, int(max_rep.max()) + 1), np.nan)
        table[:, :, 0] = 0.0

        def speedup(jobs: np.ndarray, nodes: np.ndarray, reps: np.ndarray) -> np.ndarray:
            vals = table[jobs, nodes, reps]
            for i, n, k in set(zip(*(a[np.isnan(vals)].tolist() for a in (jobs, nodes, reps)))):
                table[i, n, k] = r.speedup(order[i], k, n)
            return table[jobs, nodes, reps]

        problem = GaProblem(base=base, max_replicas=max_rep, capacity=vn.capacity, speedup=speedup,
                            restart=np.array([r.restart[j] for j in order]), scale=r.scale, p=self.p,
                            max_nodes=VNODE_MAX_NODES)
        ids = [v.job_id for v in views]
        rng = np.random.default_rng([ctx.seed, ctx.round_index])
        best, last = search(problem, self._ga_start(ids, vn.keys, base), rng, self.generations, self.population)
        self._ga_last = (ids, vn.keys, last)
        wanted = {}
        for i, v in enumerate(views):
            kept = vn.one_type(best[i])
            if kept:
                wanted[v.job_id] = kept
        r.wanted = {jid: vn.shape_of(k) for jid, k in wanted.items()}
        return vn.pin(ctx, views, base, best, wanted)

    def _ga_start(self, ids: list[str], keys: list[tuple[int, int]], base: np.ndarray) -> np.ndarray:
        """The previous round's last population on this round's jobs and nodes (new jobs
        at zero); the current allocation alone in the first round."""
        if self._ga_last is None:
            return base[None]
        prev_ids, prev_keys, prev = self._ga_last
        out = np.zeros((len(prev), *base.shape), dtype=np.int64)
        rows = {jid: i for i, jid in enumerate(prev_ids)}
        cols = {k: i for i, k in enumerate(prev_keys)}
        src_j = [rows[j] for j in ids if j in rows]
        dst_j = [i for i, j in enumerate(ids) if j in rows]
        src_v = [cols[k] for k in keys if k in cols]
        dst_v = [i for i, k in enumerate(keys) if k in cols]
        out[np.ix_(range(len(prev)), dst_j, dst_v)] = prev[np.ix_(range(len(prev)), src_j, src_v)]
        return out

    @staticmethod
    def _configs(t: str, gpn: int) -> list[Shape]:
        out, g = [], 1
        while g <= min(gpn, VNODE_GPUS):
            out.append(Shape(t, 1, g))
            g *= 2
        if gpn > VNODE_GPUS:
            out.append(Shape(t, 1, gpn))
        for k in range(2, 64 // gpn + 1):
            out.append(Shape(t, k, gpn))
        return out

    def _believed(self, world, job: GoodputJob, gpus: int, progress: float, types: list[str],
                  gpn: dict[str, int], vnodes: int | None = None) -> float:
        """The type-blind goodput of ``gpus`` GPUs spread evenly over ``vnodes`` virtual
        nodes (default: as few as hold them), the virtual nodes merged into the type's
        nodes where they fit: the mean over the GPU types."""
        epoch = world.curves(job.application).epoch_of(progress)
        key = (job.job_id, gpus, vnodes, epoch)
        if key in self._belief:
            return self._belief[key]
        if vnodes is None:
            per = [VNODE_GPUS] * (gpus // VNODE_GPUS) + ([gpus % VNODE_GPUS] if gpus % VNODE_GPUS else [])
        else:
            q, extra = divmod(gpus, vnodes)
            per = [q + 1] * extra + [q] * (vnodes - extra)
        rates = []
        for t in types:
            nodes: list[int] = []                        # virtual nodes merged into the type's nodes
            for x in per:
                if nodes and nodes[-1] + x <= gpn[t]:
                    nodes[-1] += x
                else:
                    nodes.append(x)
            seg = world.on_placement(job, t, tuple(nodes), progress, ADAPTIVE)
            if seg is not None:
                rates.append(1.0 / seg.seconds_per_unit)
        g = float(np.mean(rates)) if rates else 0.0
        if len(self._belief) > 200_000:
            self._belief.clear()
        self._belief[key] = g
        return g


class _Round:
    """What both searches share in one round: each job's replica limit, its restart
    factor and its believed speedups (module doc)."""

    def __init__(self, policy: Pollux, ctx: RoundContext):
        self.policy = policy
        self.world = world = goodput_model(ctx).world
        self.gpn = {g.gpu_type: g.gpus_per_node for g in ctx.cluster.groups}
        self.types = list(dict.fromkeys(g.gpu_type for g in ctx.cluster.groups))
        self.free = free_gpus(ctx, self.types)
        total = sum(self.free.values())
        cfg = world.config
        self.cap = int(policy.max_replicas) if policy.max_replicas is not None else min(
            cfg.gpus_per_node[c] * min(cfg.nodes[c], cfg.max_physical_nodes[c]) for c in cfg.nodes)
        self.views = list(ctx.jobs)
        self.fitted = policy.estimates == "fitted"
        self.fair = math.ceil(total / len(self.views))
        self.scale = (total / VNODE_GPUS) / total             # dominant share x number of virtual nodes
        self.limit: list[int] = []
        self.restart: list[float] = []
        self.base: list[float | None] = []
        self.progress: list[float] = []
        self.wanted: dict[str, Shape] = {}
        for v in self.views:
            job = job_of(v)
            rec = policy.seen.jobs[v.job_id]
            aws = world.on(job.application, self.types[0])
            prof = max(rec.profiled.values(), default=0)
            self.limit.append(min(max(int(policy.factor * prof), 1), self.cap, aws.max_batch // aws.min_local_bsz))
            prog = progress_of(v)
            self.progress.append(prog)
            if self.fitted:
                # the fitted model's goodput on a fair share on one node (the artifact's)
                base = self._fitted(len(self.base), self.fair, 1) if rec.blind and rec.grad is not None else None
            else:
                # the goodput on a fair share (at most what its batch limits allow: the artifact's
                # fitted model extrapolates there, the profiles cannot)
                base = self._believed(len(self.base), min(self.fair, aws.max_batch // aws.min_local_bsz)) \
                    if prof else None
            if base is not None and not base > 0:
                base = self._believed(len(self.base), 1) if not self.fitted else self._fitted(len(self.base), 1, 1)
            self.base.append(base)
            age = ctx.now_s - job.arrival_s
            span = age + policy.restart_s       # (0 with restart_delay_s=0 at a job's arrival: nothing to lose)
            self.restart.append(max(age - v.reconfigurations * policy.restart_s, 0.0) / span if span > 0 else 1.0)

    def _believed(self, j: int, gpus: int, vnodes: int | None = None) -> float:
        return self.policy._believed(self.world, job_of(self.views[j]), gpus, self.progress[j], self.types,
                                     self.gpn, vnodes)

    def _fitted(self, j: int, gpus: int, nodes: int) -> float:
        """Pollux's throughput model fitted to every point the job measured whatever the
        GPU type, with the gradient statistics it last measured (``estimates=fitted``)."""
        from estimators.goodput import fit_throughput, fitted_goodput
        v = self.views[j]
        rec = self.policy.seen.jobs[v.job_id]
        if not rec.blind or rec.grad is None:
            return 0.0
        key = (v.job_id, len(rec.blind))
        params = self.policy._fits.get(key)
        if params is None:
            if len(self.policy._fits) > 10_000:
                self.policy._fits.clear()
            params = self.policy._fits[key] = fit_throughput([(*k, *p) for k, p in rec.blind.items()])
        app = self.world.on(job_of(v).application, self.types[0])    # the artifact's 'aws' application
        return fitted_goodput(params, rec.grad, app.init_batch, nodes, gpus, app.max_batch, app.min_local_bsz,
                              app.max_local_bsz)

    def speedup(self, j: int, gpus: int, vnodes: int | None = None) -> float:
        """Job ``j``'s believed speedup on ``gpus`` GPUs (over ``vnodes`` virtual nodes)."""
        base = self.base[j]
        if base is None:
            return gpus / self.fair                              # never run: linear speedup
        if self.fitted:
            g = self._fitted(j, gpus, vnodes if vnodes is not None else -(-gpus // VNODE_GPUS))
        else:
            g = self._believed(j, gpus, vnodes)
        return g / base if base > 0 else 0.0


@register_policy("pollux")
def make_pollux(**config: Any) -> Pollux:
    """Pollux on the Sia artifact's goodput jobs (engine/decide/policies/pollux.py)."""
    return Pollux("pollux", **config)


@register_policy("pollux-artifact")
def make_pollux_artifact(**config: Any) -> Pollux:
    """``pollux`` as the Sia artifact runs it: its genetic search and its type-blind
    fitted belief (``search=ga``, ``estimates=fitted``; either can be overridden)."""
    return Pollux("pollux-artifact", {"search": "ga", "estimates": "fitted"}, **config)
