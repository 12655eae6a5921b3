"""Online profiling in the simulator: after a job has run N iterations on one grid, how
close are the ``online`` model's estimates to the truth oracle, on that grid and on its
neighbours?

For every feasible measured row of the Arena table (model, batch, GPU type, nodes, GPUs
per node) a job runs on that shape with the pipeline depth its base estimate prefers,
under ``SimExecutor`` (the truth: the measured-table oracle, ``instances.oracle``
``TableOracle``; measured times carry SimExecutor's per-iteration noise) until N whole
iterations are measured; its progress goes through the round loop's ``OnlineFeed`` to
the model's ``observe`` — the only way the truth reaches the estimates. Then its
estimates are compared with the oracle's time:

- ``own``: the grid it ran on;
- ``gpus x2`` / ``gpus /2``: same GPU type, twice / half the GPUs (more or fewer nodes, or
  GPUs per node);
- ``pipeline depth``: the same shape with another pipeline depth (the oracle has no
  pipeline dimension: a shape's truth is its best plan's time);
- ``node shape``: the same GPUs spread over twice / half the nodes;
- ``gpu type``: another GPU type, same nodes x GPUs per node.

A neighbouring shape's estimate is the fastest over its pipeline depths (what a policy
picks). Errors are |estimate / truth - 1|; ``measured`` rows restrict to neighbours whose
truth is a measured table row (not the oracle's extrapolation). The base model's error
on the same pairs, without observations, is printed alongside.

Every row is judged by a fresh model that has seen, besides the job's own run, the
cluster's history (``--history``): ``none``; ``others`` — every other job (another model,
or the same model at another global batch) ran ``--iterations`` on each of its measured
shapes first; ``other-models`` — only jobs of other models did (the job's model is new to
the cluster). ``--held-out-prior`` fits the prior without the job's model's rows
(``estimators.evaluation.online_prior``), so that the prior has not seen what it is
judged on; otherwise the shipped prior (fitted on every row) is used.

    PYTHONPATH=. .venv/bin/python bench/bench_online.py [--base analytic] [--iterations 20] \
        [--noise-cv 0.05] [--limit N] [--also-ran "gpus x2"] [--history none|others|other-models] \
        [--held-out-prior] [--fit-prior] [--json]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

from engine.core.allocation import Allocation
from engine.core.executor import JobProgress
from engine.core.online_feed import OnlineFeed
from engine.core.reconfig import ReconfigCostModel
from engine.sim.sim_executor import DEFAULT_ITERATION_NOISE_CV, SimExecutor
from estimators import make_performance_model
from estimators.evaluation.online_prior import fit_prior_to_points, measured_points
from estimators.online import OnlineModel, OnlinePrior
from instances.grid import Grid, Shape
from instances.jobs import Job
from instances.measurements import load_measured_iter_times
from instances.oracle import TableOracle

KINDS = ("own", "gpus x2", "gpus /2", "pipeline depth", "node shape", "gpu type")
HISTORIES = ("none", "others", "other-models")
MAX_GPUS_PER_NODE = 8


def _pps(shape: Shape) -> list[int]:
    return [p for p in range(1, shape.num_gpus + 1) if shape.num_gpus % p == 0]


def _best(model, job: Job, shape: Shape, skip_pp: int | None = None) -> tuple[float, Grid] | None:
    best = None
    for pp in _pps(shape):
        if pp == skip_pp:
            continue
        e = model.estimate(job, Grid(shape, pp))
        if e.feasible and math.isfinite(e.iteration_time_s) and (best is None or e.iteration_time_s < best[0]):
            best = (e.iteration_time_s, Grid(shape, pp))
    return best


def neighbours(shape: Shape, types: list[str]) -> list[tuple[str, Shape]]:
    t, n, g = shape.gpu_type, shape.num_nodes, shape.gpus_per_node
    out = []
    if 2 * g <= MAX_GPUS_PER_NODE:
        out.append(("gpus x2", Shape(t, n, 2 * g)))
    out.append(("gpus x2", Shape(t, 2 * n, g)))
    if g % 2 == 0:
        out.append(("gpus /2", Shape(t, n, g // 2)))
        out.append(("node shape", Shape(t, 2 * n, g // 2)))
    if n % 2 == 0:
        out.append(("gpus /2", Shape(t, n // 2, g)))
        if 2 * g <= MAX_GPUS_PER_NODE:
            out.append(("node shape", Shape(t, n // 2, 2 * g)))
    out += [("gpu type", Shape(o, n, g)) for o in types if o != t]
    return out


def run_job(online: OnlineModel, oracle, job: Job, grid: Grid, iterations: int, noise_cv: float,
            seed: int) -> JobProgress:
    """Run ``job`` on ``grid`` in SimExecutor until ``iterations`` whole iterations are
    measured; feed its progress to ``online`` as the round loop does."""
    alloc, p = measure(oracle, job, grid, iterations, noise_cv, seed)
    OnlineFeed(online).report(job, alloc, p)
    return p


def measure(oracle, job: Job, grid: Grid, iterations: int, noise_cv: float, seed: int
            ) -> tuple[Allocation, JobProgress]:
    """(allocation, progress) of ``job`` run on ``grid`` in SimExecutor until
    ``iterations`` whole iterations are measured."""
    ex = SimExecutor(oracle, ReconfigCostModel(), iteration_noise_cv=noise_cv, seed=seed)
    s = grid.shape
    alloc = Allocation(grid, tuple((n, i) for n in range(s.num_nodes) for i in range(s.gpus_per_node)))
    ex.advance(0.0)
    ex.launch(job, alloc, None, 0.0)
    down = ex.reconfig.cost_s(job, None, alloc)
    truth = oracle.true_iteration_time(job, s)
    ex.advance(down + (iterations + 0.5) * truth)
    return alloc, ex.progress(job.job_id)


def history_runs(proto: OnlineModel, oracle, rows, iterations: int, noise_cv: float, seed: int) -> list[tuple]:
    """(job, allocation, progress) of every measured row run ``iterations`` iterations, at
    the pipeline depth the base model prefers; one job per (model, global batch)."""
    ids: dict[tuple, str] = {}
    out = []
    for i, r in enumerate(rows):
        jid = ids.setdefault((r.model, r.global_batch), f"h{len(ids)}")
        job = Job(jid, r.model, r.global_batch, 10**9, 0.0)
        shape = Shape(r.gpu_type, r.num_nodes, r.gpus_per_node)
        best = _best(proto.base, job, shape)
        if best is None or oracle.true_iteration_time(job, shape) is None:
            continue
        out.append((job, *measure(oracle, job, best[1], iterations, noise_cv, seed + 2 * 10**6 + i)))
    return out


def evaluate(base: str, iterations: int, noise_cv: float, limit: int | None, seed: int, progress=None,
             prior=None, also_ran: str | None = None, history: str = "none", held_out_prior: bool = False):
    oracle = TableOracle()
    all_rows = [r for r in load_measured_iter_times() if r.iter_time_s is not None]
    rows = all_rows[:: max(1, len(all_rows) // limit)][:limit] if limit else all_rows
    types = sorted({r.gpu_type for r in rows})
    proto = make_performance_model("online", base=base, prior=prior)
    past = [] if history == "none" else history_runs(proto, oracle, all_rows, iterations, noise_cv, seed)
    priors: dict[str, OnlinePrior] = {}
    points = measured_points(online=proto) if held_out_prior else []
    errs: dict[tuple[str, bool], list[float]] = {}
    base_errs: dict[tuple[str, bool], list[float]] = {}
    history_errs: dict[tuple[str, bool], list[float]] = {}
    skipped = 0
    for i, r in enumerate(rows):
        job = Job(f"j{i}", r.model, r.global_batch, 10**9, 0.0)
        if held_out_prior and r.model not in priors:
            priors[r.model] = fit_prior_to_points([p for p in points if p.model != r.model])[0]
        online = OnlineModel(base=proto.base, prior=priors.get(r.model, proto.prior),
                             calibrated_types=proto.calibrated_types)
        for pjob, alloc, p in past:
            if (pjob.model, pjob.global_batch) != (job.model, job.global_batch) and \
                    (history == "others" or pjob.model != job.model):
                OnlineFeed(online).report(pjob, alloc, p)
        shape = Shape(r.gpu_type, r.num_nodes, r.gpus_per_node)
        own = _best(online, job, shape)
        truth = oracle.true_iteration_time(job, shape)
        if own is None or truth is None:
            skipped += 1          # no feasible base plan, or slower than the oracle's cap (infeasible there)
            continue
        grid = own[1]
        base_own = online.base.estimate(job, grid).iteration_time_s
        before = {g: e.iteration_time_s for g in (Grid(shape, pp) for pp in _pps(shape))
                  if (e := online.estimate(job, g)).feasible}   # history only: before the job's own run
        before.update({ns: nb[0] for _, ns in neighbours(shape, types) if (nb := _best(online, job, ns))})
        p = run_job(online, oracle, job, grid, iterations, noise_cv, seed + i)
        assert p.measured_iterations == iterations, p
        second = None
        if also_ran is not None:        # the job also ran on its first measured neighbour of that kind
            for kind, nshape in neighbours(shape, types):
                nb = _best(online.base, job, nshape)
                if kind == also_ran and nb is not None and oracle.is_measured(job.model, job.global_batch, nshape) \
                        and oracle.true_iteration_time(job, nshape) is not None:
                    second = nshape
                    run_job(online, oracle, job, nb[1], iterations, noise_cv, seed + i + 10**6)
                    break
            if second is None:
                skipped += 1
                continue
        pairs = [("own", grid, online.estimate(job, grid).iteration_time_s, base_own, before[grid], truth, True)]
        for pp in _pps(shape):
            if pp != grid.pp:
                g = Grid(shape, pp)
                e = online.estimate(job, g)
                if e.feasible and math.isfinite(e.iteration_time_s):
                    b = online.base.estimate(job, g).iteration_time_s
                    pairs.append(("pipeline depth", g, e.iteration_time_s, b, before.get(g, b), truth, True))
        for kind, nshape in neighbours(shape, types):
            if nshape == second:
                continue
            t = oracle.true_iteration_time(job, nshape)
            est = _best(online, job, nshape)
            b = _best(online.base, job, nshape)
            if t is None or est is None or b is None:
                continue
            pairs.append((kind, est[1], est[0], b[0], before.get(nshape, b[0]), t,
                          oracle.is_measured(job.model, job.global_batch, nshape)))
        for kind, _g, est, b, pre, t, measured in pairs:
            for key in ((kind, False), (kind, True)) if measured else ((kind, False),):
                errs.setdefault(key, []).append(abs(est / t - 1))
                base_errs.setdefault(key, []).append(abs(b / t - 1))
                history_errs.setdefault(key, []).append(abs(pre / t - 1))
        if progress is not None:
            progress(i + 1, len(rows))
    return errs, base_errs, history_errs, skipped, len(rows)


def summarize(errs, base_errs, history_errs) -> list[dict]:
    out = []
    for measured in (True, False):
        for kind in KINDS:
            e = errs.get((kind, measured))
            if not e:
                continue
            target = 0.05 if kind == "own" else 0.10
            a, b, h = np.array(e), np.array(base_errs[(kind, measured)]), np.array(history_errs[(kind, measured)])
            out.append({"kind": kind, "truth": "measured rows" if measured else "all (oracle incl. extrapolated)",
                        "pairs": len(e), "target": target, "median_err": float(np.median(a)),
                        "p90_err": float(np.quantile(a, 0.9)), "worst_err": float(a.max()),
                        "within_target": float((a <= target).mean()),
                        "base_median_err": float(np.median(b)), "base_within_target": float((b <= target).mean()),
                        "history_only_median_err": float(np.median(h)),
                        "history_only_within_target": float((h <= target).mean())})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="analytic", help="base kind of the online model (analytic, learned, table)")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--noise-cv", type=float, default=DEFAULT_ITERATION_NOISE_CV)
    ap.add_argument("--limit", type=int, default=None, help="at most this many measured rows (spread evenly)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--also-ran", choices=KINDS[1:], default=None,
                    help="the job also runs --iterations on its first measured neighbour of this kind (rows "
                         "without one are skipped); that neighbour is left out of the comparison")
    ap.add_argument("--history", choices=HISTORIES, default="none",
                    help="what other jobs ran before each judged job (module docstring)")
    ap.add_argument("--held-out-prior", action="store_true",
                    help="fit the prior without the judged job's model's rows (one fit per model)")
    ap.add_argument("--fit-prior", action="store_true",
                    help="fit the online prior to the base model on the measured table first (and print it)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.iterations < 1 or a.noise_cv < 0:
        ap.error("--iterations >= 1 and --noise-cv >= 0")
    t0 = time.perf_counter()

    def prog(k, n):
        if k % 25 == 0 or k == n:
            print(f"  {k}/{n} rows ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)

    prior = None
    if a.fit_prior:
        from estimators.evaluation.online_prior import fit_online_prior
        prior, diag = fit_online_prior(a.base)
        print(f"fitted prior: {prior} {diag}", file=sys.stderr)
    errs, base_errs, history_errs, skipped, n = evaluate(a.base, a.iterations, a.noise_cv, a.limit, a.seed, prog, prior,
                                           a.also_ran, a.history, a.held_out_prior)
    rows = summarize(errs, base_errs, history_errs)
    res = {"base": a.base, "prior": "held out by model" if a.held_out_prior else vars(prior) if prior else "default",
           "history": a.history, "also_ran": a.also_ran,
           "iterations": a.iterations,
           "noise_cv": a.noise_cv, "rows": n,
           "rows_skipped": skipped, "summary": rows, "wall_s": time.perf_counter() - t0}
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    also = f" and as many on a '{a.also_ran}' neighbour" if a.also_ran else ""
    also += f"; history: {a.history}; prior: {res['prior'] if isinstance(res['prior'], str) else 'fitted'}"
    print(f"online({a.base}) after {a.iterations} measured iterations{also} (noise CV {a.noise_cv:g}); "
          f"{n} measured rows, "
          f"{skipped} skipped (no feasible base plan, over the oracle's time cap, or no --also-ran neighbour)")
    print(f"{'truth':<32} {'neighbour':<15} {'pairs':>6} {'median':>7} {'p90':>7} {'worst':>7} {'within':>7}   "
          f"{'base median':>11} {'base within':>11}   {'history-only median':>19} {'within':>7}")
    for r in rows:
        print(f"{r['truth']:<32} {r['kind']:<15} {r['pairs']:>6} {r['median_err']:>7.1%} {r['p90_err']:>7.1%} "
              f"{r['worst_err']:>7.1%} {r['within_target']:>7.1%}   {r['base_median_err']:>11.1%} "
              f"{r['base_within_target']:>11.1%}   {r['history_only_median_err']:>19.1%} "
              f"{r['history_only_within_target']:>7.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
