"""``arena bench incremental``: the incremental search's objective against the full
per-round MILP's, and both decision times, over synthetic rounds (the group's doc:
``engine/cli/commands/bench``)."""
from __future__ import annotations

import math
import sys

from ...common import seed_arg
from ...flags import fields_as_flags
from ...jsonout import dumps
from .synthetic import check_synthetic_args, parse_weights


def register(sub) -> None:
    i = sub.add_parser("incremental", help="the incremental search against the full MILP, round by round",
                       description="The incremental search's objective as a fraction of the full per-round MILP's "
                                   "(same c @ x) and both decision times, over synthetic rounds that each start "
                                   "from the previous round's allocation.")
    i.add_argument("--gpus", type=int, default=1280, help="cluster size (default 1280)")
    i.add_argument("--jobs", type=int, default=500, help="active jobs per round (default 500)")
    i.add_argument("--rounds", type=int, default=5, help="rounds compared after the first (default 5)")
    i.add_argument("--backend", default="auto", help="the MILP's backend (default auto)")
    i.add_argument("--time-limit", type=float, default=30.0, help="the MILP's per-round time limit, s")
    i.add_argument("--rel-gap", type=float, default=0.01, help="the MILP's relative gap (default 0.01)")
    i.add_argument("--seed", type=seed_arg, default=0, help="synthetic rounds' seed (default 0)")
    i.add_argument("--objective", default="throughput=1,jct=1,queue=1,reconfig=1",
                   help="term=weight list (default: arena's)")
    i.add_argument("--move-cost-per-gpu", type=float, default=None,
                   help="move downtime per GPU of the new grid, s (default: the simulator's ReconfigCostModel)")
    i.add_argument("--move-cost-cap", type=float, default=None,
                   help="move downtime cap, s (default: the simulator's ReconfigCostModel)")
    i.add_argument("--queued", default="all", help="queued jobs' candidates: all or small (default all)")
    i.add_argument("--other-type", default="same",
                   help="running jobs' candidates on another GPU type: same (GPU count) or any (default same)")
    i.add_argument("--move-budget-jobs", type=float, default=1.0, help="fraction of running jobs that may move")
    i.add_argument("--move-budget-gpus", type=float, default=1.0, help="fraction of GPUs that may move")
    i.add_argument("--follow", default="incremental", choices=("incremental", "milp"),
                   help="whose decision the next round starts from (default incremental)")
    i.add_argument("--json", action="store_true", help="print JSON (rows and summary) instead of a table")
    i.set_defaults(func=run_incremental_bench)


def run_incremental_bench(args) -> int:
    from engine.core.reconfig import ReconfigCostModel
    from engine.decide.incremental import IncrementalConfig
    from engine.decide.incremental.yardstick import summarize, yardstick
    from engine.decide.objectives import parse_objective
    from engine.decide.solvers import make_backend
    from instances.errors import InputError

    check_synthetic_args(args, "--rounds")
    with fields_as_flags({"backend": "--backend"}):
        make_backend(args.backend)                 # an unknown name fails before any work
    try:
        config = IncrementalConfig(queued=args.queued, other_type=args.other_type,
                                   move_budget_jobs=args.move_budget_jobs,
                                   move_budget_gpus=args.move_budget_gpus)
    except ValueError as e:                     # "queued must be ...": the field, then the reason
        name, _, reason = str(e).partition(" ")
        raise InputError(reason, field="--" + name.replace("_", "-")) from None
    defaults = ReconfigCostModel()
    per_gpu = defaults.replan_per_gpu_s if args.move_cost_per_gpu is None else args.move_cost_per_gpu
    cap = defaults.replan_cap_s if args.move_cost_cap is None else args.move_cost_cap
    for flag, v in (("--move-cost-per-gpu", per_gpu), ("--move-cost-cap", cap)):
        if not (math.isfinite(v) and v >= 0):
            raise InputError(f"must be a finite number of seconds >= 0, got {v}", field=flag)
    objective = parse_objective({}, parse_weights(args.objective))
    log = None if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    if log:
        log(f"bench incremental: {args.gpus} GPUs, {args.jobs} jobs, {args.rounds} rounds after the first; "
            f"moves {per_gpu:g} s/GPU, at most {cap:g} s; MILP backend {args.backend}")
    # Both sides are single-threaded designs; left alone, BLAS's idle worker threads spin on
    # the other core after a call and bill their time to whichever side runs next.
    from threadpoolctl import threadpool_limits

    from engine.decide.incremental import kernel
    load_s = kernel.warm_up()
    if log:
        log(f"  the search's compiled kernels loaded in {load_s:.2f} s (once per process, not in the round times)")
    with threadpool_limits(limits=1):
        rows = yardstick(args.gpus, args.jobs, args.rounds, objective, config, backend=args.backend,
                         time_limit_s=args.time_limit, rel_gap=args.rel_gap, seed=args.seed,
                         reconfig_s_per_gpu=per_gpu, reconfig_cap_s=cap, follow=args.follow, log=log)
    summary = summarize(rows)
    summary.update(kernel_load_s=load_s, gpus=args.gpus, jobs=args.jobs, move_cost_per_gpu_s=per_gpu,
                   move_cost_cap_s=cap,
                   backend=args.backend, follow=args.follow, queued=args.queued, other_type=args.other_type,
                   move_budget_jobs=args.move_budget_jobs, move_budget_gpus=args.move_budget_gpus)
    if args.json:
        print(dumps({"summary": summary, "rounds": rows}, indent=2))
        return 0
    print(f"{'round':>5} {'cands':>7} {'ratio':>7} {'stay':>7} {'MILP s':>8} {'incr s':>8} {'speedup':>8} "
          f"{'moved':>6} {'MILP status':>11}")
    for r in rows:
        print(f"{r['round']:>5} {r['candidates']:>7} {r['ratio']:>7.4f} {r['stay_ratio']:>7.4f} "
              f"{r['milp_time_s']:>8.4f} {r['incremental_time_s']:>8.4f} {r['speedup']:>8.1f} "
              f"{r['moved_jobs']:>6} {r['milp_status']:>11}")
    print(f"ratio (incremental c@x / MILP c@x): min {summary['min_ratio']:.4f}, median {summary['median_ratio']:.4f}; "
          f"median decision time {summary['median_incremental_time_s']:.4f} s vs {summary['median_milp_time_s']:.4f} s "
          f"(median speedup {summary['median_speedup']:.1f}x, min {summary['min_speedup']:.1f}x; "
          f"in CPU time {summary['median_cpu_speedup']:.1f}x); "
          f"stay = the start allocation's value")
    print(f"incremental decision time, medians: candidates {summary['median_incremental_candidates_s']:.4f} s, "
          f"restricted model {summary['median_incremental_model_s']:.4f} s, "
          f"search {summary['median_incremental_search_s']:.4f} s (its setup "
          f"{summary['median_incremental_setup_s']:.4f} s, first expand "
          f"{summary['median_incremental_expand_s']:.4f} s, balance and the second expand "
          f"{summary['median_incremental_balance_s']:.4f} s)")
    return 0


