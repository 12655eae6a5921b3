"""Why a round gave a job fewer GPUs than it asked for, or none: in words, for ``arena
status ID`` and the page (each decided round stores them with its decision:
``rounds.decisions["why"]``).

A job's ``gpus`` (``JobSpec.gpus``, ``Job.requested_gpus``) is a request each policy reads
its own way: ``fcfs`` and ``gavel`` give the count asked; the optimizing policies
(``arena``, ``sia`` ...) measure a job's throughput against it and choose the count
their performance model favours. So a job can run on fewer GPUs than it asked for
while others sit idle, and only the round knows why. For each job that asked and got
fewer (or none), ``explain`` names the first of:

- a fallback: the grid the policy chose did not fit the GPUs free this round, and the
  placement took the policy's smaller alternative (``DecisionStats.placement_fallbacks``),
  or none fitted (``placement_dropped``);
- memory: no grid of the count asked fits its memory by the performance model's estimate,
  or every such shape ran out of memory when launched (``JobView.known_infeasible_shapes``);
  or the cluster has no grid of that count at all;
- the policy's estimate: the model's iterations per second on the grid chosen against
  the best grid of the count asked (more GPUs not estimated faster), or, when the count
  asked is estimated faster, that the policy's objective gave the GPUs otherwise.

At most ``MAX_EXPLAINED`` jobs a round (running ones first, then the queue in the
context's order), so a round with thousands queued does not estimate them all.
"""
from __future__ import annotations

from engine.core.context import Decisions, JobView, RoundContext
from estimators.grids import candidate_grids
from instances.grid import Grid

MAX_EXPLAINED = 100


def explain(ctx: RoundContext, decisions: Decisions, policy: str) -> dict[str, str]:
    """Job id -> why it was given fewer GPUs than it asked for (or none) this round."""
    out: dict[str, str] = {}
    views = sorted((v for v in ctx.jobs if v.job.requested_gpus), key=lambda v: v.current is None)
    for v in views:
        if len(out) >= MAX_EXPLAINED:
            break
        grid = decisions.grids.get(v.job_id)
        if grid is not None and grid.num_gpus >= int(v.job.requested_gpus or 0):
            continue
        out[v.job_id] = _why(ctx, decisions, v, grid, policy)
    return out


def _why(ctx: RoundContext, decisions: Decisions, v: JobView, grid: Grid | None, policy: str) -> str:
    asked = int(v.job.requested_gpus or 0)
    stats = decisions.stats
    if v.job_id in stats.placement_fallbacks:
        return (f"a fallback: {policy} chose {stats.placement_fallbacks[v.job_id]}, which did not fit the GPUs free "
                f"this round; the placement took its smaller alternative {grid}")
    if v.job_id in stats.placement_dropped:
        return f"a fallback: {policy} chose a grid for it that did not fit the GPUs free this round, nor did any " \
               "smaller alternative"
    perf = ctx.perf
    if perf is None:
        return f"{policy} decides without a performance model; it gave it " + (f"{grid}" if grid else "no grid")
    pool = [g for g in candidate_grids(v.job, ctx.cluster, max_gpus=asked, gpu_counts=[asked], prune=False)
            if v.job.requested_gpu_type in (None, g.gpu_type)]
    if not pool:
        return f"memory: cluster {ctx.cluster.name!r} has no grid of {asked} GPUs for it"
    ran_out = [g for g in pool if g.shape in v.known_infeasible_shapes]
    fit = [(g, e) for g in pool if g not in ran_out and (e := perf.estimate(v.job, g)).feasible]
    if not fit:
        if ran_out:
            return f"memory: every {asked}-GPU grid ran out of memory or is estimated not to fit (it ran out on " \
                   f"{', '.join(map(str, ran_out[:3]))})"
        return f"memory: no {asked}-GPU grid fits its memory by the performance model's estimate ({perf.name})"
    best, est = min(fit, key=lambda ge: ge[1].iteration_time_s)
    best_rate = 1.0 / est.iteration_time_s
    asked_words = f"{best_rate:.3g} it/s on {best} ({asked} GPUs, the best shape)"
    if grid is None:
        return (f"the policy's estimate ({perf.name}): {asked_words}; {policy} left it waiting this round (other "
                "jobs' grids, or none of its grids fitting the GPUs free)")
    mine = perf.estimate(v.job, grid)
    rate = 1.0 / mine.iteration_time_s if mine.feasible and mine.iteration_time_s > 0 else 0.0
    if best_rate <= rate * 1.001:
        return (f"the policy's estimate ({perf.name}): {rate:.3g} it/s on {grid} against {asked_words}: more GPUs "
                "are not estimated faster")
    return (f"the policy's estimate ({perf.name}): {rate:.3g} it/s on {grid} against {asked_words}; {policy}'s "
            "objective still gave the GPUs otherwise (other jobs' throughput, the price of a move or the stability "
            "rule)")
