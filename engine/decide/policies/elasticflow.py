"""``elasticflow-ls`` baseline (Gu et al., ASPLOS'23), as the Arena comparison configured
it: loose deadlines, admission control, and diminishing-returns allocation of what is
left, with data-parallel-only estimates and a data-parallel memory check.

What it knows: each job's remaining work and deadline (its admission needs both:
clairvoyant); data-parallel-only estimates.

Each round:
1. every job's deadline is loosened: arrival + ``slack_factor`` x (deadline - arrival)
   (no deadline: none);
2. jobs in earliest-deadline order get their *minimum satisfactory share*: the fewest
   GPUs (of their requested type, ElasticFlow being built for one GPU type; set
   ``heterogeneous=true`` to allow every type) whose estimated rate meets the loosened
   deadline; admission control admits a job only if that share fits;
3. the GPUs left go, one doubling at a time, to the admitted job with the largest
   normalized throughput gain per added GPU (diminishing returns), while they fit.

Jobs the stability rule freezes (engine/decide/stability.py) keep their grid and are served
first. Under the rule's cluster-wide budget, a round whose allocation moves more running
jobs than the round's allowance is allocated again with every running job kept where it
is except the first ``allowance`` of those moves in deadline order (the MILP policies
bound the same count with a row of their model; preemptions are outside it in both).
``elasticflow-ls-ap`` decides from the same estimates as arena and runs each job with
the planner's best plan for the GPU type and count it gets.

What it simplifies: ElasticFlow drops jobs it cannot admit; here they wait (no job is
ever lost) and jobs whose deadline can no longer be met run best-effort on their
smallest share after the admitted ones. Capacity uses the same node-shape accounting
as the MILP; the round's placement places the result, taking a job's ranked fallback
columns (by speedup) where its grid does not fit.
"""
from __future__ import annotations

import heapq
import math

import numpy as np

from engine.core.context import Decisions, DecisionStats, JobView, RoundContext
from engine.core.policy import Policy, Workload, refuse_unknown_options, register_policy
from estimators.perf import DpOnlyTwin
from instances.cluster import MAX_CLUSTER_GPUS
from instances.errors import InputError
from instances.grid import Grid
from instances.limits import check_coefficient

from ..fallbacks import RankedColumns
from ..formulation.round_data import (
    GridCache,
    RoundDataCache,
    best_plan_per_count,
    build_round_data,
    columns_of_jobs,
    freeze_jobs,
)
from ..stability import STABILITY_KEYS, StabilityRule, parse_bool
from .milp import _number


class _Usage:
    def __init__(self, cap):
        self.cap = cap
        self.used = [[0.0] * len(lv) for lv in cap.levels]

    def delta(self, data, k, sign):
        t, n, m = data.col_type[k], data.col_nodes[k], data.col_gpn[k]
        return [(t, li, sign * n * m / lvl) for li, lvl in enumerate(self.cap.levels[t]) if m >= lvl]

    def fits(self, data, k, release=None):
        changes = self.delta(data, k, +1) + (self.delta(data, release, -1) if release is not None else [])
        tot: dict = {}
        for t, li, d in changes:
            tot[(t, li)] = tot.get((t, li), 0.0) + d
        return all(self.used[t][li] + d <= self.cap.blocks[t][li] + 1e-9 for (t, li), d in tot.items())

    def apply(self, data, k, sign):
        for t, li, d in self.delta(data, k, sign):
            self.used[t][li] += d


class ElasticFlowLS(Policy):
    KEYS = ("slack_factor", "heterogeneous", "max_gpus") + STABILITY_KEYS

    def __init__(self, *, ap: bool = False, **config):
        self.ap = ap
        self.name = "elasticflow-ls-ap" if ap else "elasticflow-ls"
        refuse_unknown_options(self.name, config, self.KEYS)
        self.stability = StabilityRule.from_config(self.name, config)
        try:
            self.slack_factor = float(config.get("slack_factor", 10.0))
        except (TypeError, ValueError, OverflowError):
            raise InputError(f"policy {self.name!r}: slack_factor must be a number, got {config['slack_factor']!r}",
                             field="slack_factor") from None
        # (a whole number: 1.5 GPUs was taken as 1)
        self.max_gpus: int = _number(self.name, config, "max_gpus", 16, int, 1, MAX_CLUSTER_GPUS)
        self.heterogeneous = parse_bool(self.name, "heterogeneous", config.get("heterogeneous", False))
        check_coefficient(self.slack_factor, field="slack_factor", minimum=1.0, what="slack_factor ")
        self._dp_only = DpOnlyTwin()
        self._grids = GridCache(dp_only=not ap)
        self._cache = RoundDataCache()

    def check_workload(self, workload: Workload) -> None:
        """ElasticFlow estimates jobs from their model: the Sia artifact's goodput jobs have none."""
        if workload.goodput:
            raise InputError(f"policy {self.name!r} decides fixed-batch jobs from their model's estimates; the Sia "
                             f"artifact's goodput jobs of {workload.name} have no model architecture (use sia, "
                             "gavel, pollux, arena, suika or fcfs there)", field="--policy")

    def _keep(self, view: JobView, grid: Grid) -> bool:
        if grid.shape in view.known_infeasible_shapes:
            return False
        want = view.job.requested_gpu_type
        return self.heterogeneous or want is None or grid.gpu_type == want

    @staticmethod
    def _allocate(data, cols, rate, left, edf, kept):
        """Steps 2 and 3 for one round: the jobs in ``kept`` keep their current column;
        the others in earliest-deadline order (``edf``). Returns the chosen column per job
        and the jobs that cannot meet their deadline (run best-effort)."""
        usage = _Usage(data.capacity)
        chosen: dict[int, int] = {}
        for j in sorted(kept):                    # the stability rule: frozen jobs keep their grid
            chosen[j] = int(data.current_col[j])
            usage.apply(data, chosen[j], +1)
        order = [j for j in edf if j not in kept]
        late = []
        for j in order:
            cj = sorted(cols[j], key=lambda k: (data.col_gpus[k], -rate[k]))
            meets = [k for k in cj if data.remaining_iterations[j] / rate[k] <= left[j]]
            if not meets:
                late.append(j)
                continue
            for k in meets:                       # minimum satisfactory share that fits
                if usage.fits(data, k):
                    usage.apply(data, k, +1)
                    chosen[j] = k
                    break
        for j in late:                            # best effort, smallest share
            for k in sorted(cols[j], key=lambda k: (data.col_gpus[k], -rate[k])):
                if usage.fits(data, k):
                    usage.apply(data, k, +1)
                    chosen[j] = k
                    break
        speed = data.speedup
        heap = []

        def push(j):
            k = chosen[j]
            ups = [u for u in cols[j] if data.col_gpus[u] == 2 * data.col_gpus[k]]
            if ups:
                u = max(ups, key=lambda u: speed[u])
                gain = (speed[u] - speed[k]) / (data.col_gpus[u] - data.col_gpus[k])
                if gain > 0:
                    heapq.heappush(heap, (-gain, data.job_ids[j], j, k, u))

        for j in chosen:
            if j not in kept:
                push(j)
        while heap:
            _, _, j, k, u = heapq.heappop(heap)
            if chosen.get(j) != k or not usage.fits(data, u, release=k):
                continue
            usage.apply(data, k, -1)
            usage.apply(data, u, +1)
            chosen[j] = u
            push(j)
        return chosen, late

    def decide(self, ctx: RoundContext) -> Decisions:
        import time
        t0 = time.perf_counter()
        perf = ctx.perf if self.ap else self._dp_only(ctx.perf)
        if perf is None:
            raise InputError(f"policy {self.name!r} decides from a performance model; none was given", field="perf")
        data = build_round_data(ctx, perf, grids_fn=self._grids, max_gpus=self.max_gpus,
                                grid_filter=self._keep, cache=self._cache)
        if self.ap:
            data = best_plan_per_count(data)
        frozen = self.stability.frozen(ctx)
        data = freeze_jobs(data, frozen)
        cols = columns_of_jobs(data)
        rate = data.col_rate_iters_per_s()
        deadline = np.array([a + self.slack_factor * (d - a) if math.isfinite(d) else math.inf
                             for a, d in zip(data.arrival_s, data.deadline_s)])
        left = deadline - data.now_s
        edf = sorted(range(data.n_jobs), key=lambda j: (deadline[j], data.arrival_s[j], data.job_ids[j]))
        kept = rule_kept = {j for j, jid in enumerate(data.job_ids) if jid in frozen and data.current_col[j] >= 0}
        chosen, late = self._allocate(data, cols, rate, left, edf, kept)
        allowance = self.stability.round_allowance(ctx)
        cur = data.current_col
        moved = [j for j in edf if cur[j] >= 0 and chosen.get(j, cur[j]) != cur[j]]
        if allowance is not None and len(moved) > allowance:
            # the cluster-wide budget: the first `allowance` moves in deadline order go
            # ahead, every other running job keeps its grid (as the MILP's move row)
            go = set(moved[:allowance])
            kept = {j for j in range(data.n_jobs) if cur[j] >= 0 and j not in go}
            chosen, late = self._allocate(data, cols, rate, left, edf, kept)
        grids = {data.job_ids[j]: data.grids[k] for j, k in chosen.items()}
        plans = {data.job_ids[j]: data.plans[k] for j, k in chosen.items() if data.plans[k] is not None}
        best_effort = len([j for j in late if j in chosen])
        stats = DecisionStats(backend="elasticflow-greedy", jobs=data.n_jobs, admitted=len(chosen) - best_effort,
                              best_effort=best_effort,
                              frozen=len(rule_kept), held_by_budget=len(kept - rule_kept), move_allowance=allowance,
                              decide_time_s=time.perf_counter() - t0)
        return Decisions(grids=grids, plans=plans, stats=stats, fallbacks=RankedColumns(data, data.speedup))


@register_policy("elasticflow-ls")
def make_elasticflow_ls(**config) -> ElasticFlowLS:
    return ElasticFlowLS(**config)


@register_policy("elasticflow-ls-ap")
def make_elasticflow_ls_ap(**config) -> ElasticFlowLS:
    """``elasticflow-ls`` deciding from the same estimates as arena, each job run with
    the planner's best plan for the GPU type and count it gets."""
    return ElasticFlowLS(ap=True, **config)
