"""`arena bench`: solver and policy benchmarks.

- ``arena bench solver --gpus G --jobs J [--backend B ...] [--repeat R] [--json]``: a
  sequence of R synthetic rounds (consecutive rounds share 95% of their jobs, as real
  rounds do), each built into the MILP and solved by every backend; per backend the
  round latency (model build + solve: cold first round, then median and p99), the
  objective, the proved gap and the statuses.
- ``arena bench incremental --gpus G --jobs J --rounds R [--json]``: the incremental
  search's quality yardstick (``engine/incremental/yardstick.py``): a sequence of
  synthetic rounds, each starting from the previous round's allocation; per round the
  incremental search's objective as a fraction of the full MILP's (same ``c @ x``) and
  both decision times.
- ``arena bench policies (--instance NAME | --cluster FILE --trace FILE) [--policy P ...]
  [--reconfig-opt preset=realistic] [--perf KIND] [--json] [--out DIR]``: every policy on
  the same workload, truth oracle and reconfiguration cost model, side by side, run out
  (every job judged), plus one PNG figure. Policies decide from estimates (the default
  performance model) unless ``--perf table`` asks for the published comparison's mode.
  ``--policy LABEL=NAME`` runs a variant of policy NAME (its options from
  ``--policy-opt LABEL:KEY=VALUE``) as its own row, e.g. an objective beside the default.
  Under ``mpiexec -n K`` the policies are spread over the ranks and rank 0 gathers the
  rows.
- ``arena bench bound (--instance NAME | --cluster FILE --trace FILE) [RUN_DIR ...]``:
  each job's JCT alone on the cluster at its fastest shape (``instances/bounds.py``), and
  the given runs' average JCT against it, split by job length (``engine/commands/bound.py``).
"""
from __future__ import annotations

import math
import os
import re
import sys
import time

from .flags import fields_as_flags
from .jsonout import dumps
from .policy_runs import (
    POLICY_COLUMNS,
    add_jct_bound,
    build_workload,
    decided_with,
    policy_bench,
    policy_colour,
    workload_args,
)
from .simulate import seed_arg

DEFAULT_BENCH_BACKENDS = ("auto", "lagrangian", "highs-lp", "highs", "greedy")
MAX_BENCH_JOBS = 100_000       # synthetic rounds' jobs (the project measures up to 4,000; 10^8 would not end)
DEFAULT_POLICIES = ("arena", "arena-incremental", "suika", "sia", "sia-ap", "gavel", "gavel-ap", "elasticflow-ls",
                    "elasticflow-ls-ap", "fcfs")
def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="benchmark solver backends and policies",
                              description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="bench_command", metavar="BENCH", required=True)

    s = sub.add_parser("solver", help="round latency and gap per solver backend on synthetic rounds",
                       description="Round latency (model build + solve), objective and proved gap per solver "
                                   "backend on a sequence of synthetic scheduling rounds.")
    s.add_argument("--gpus", type=int, default=1280, help="cluster size (default 1280)")
    s.add_argument("--jobs", type=int, default=500, help="active jobs per round (default 500)")
    s.add_argument("--backend", action="append",
                   help=f"backend (repeatable; default {', '.join(DEFAULT_BENCH_BACKENDS)})")
    s.add_argument("--repeat", type=int, default=5, help="rounds in the sequence (default 5)")
    s.add_argument("--time-limit", type=float, default=30.0, help="per-round solver time limit, s")
    s.add_argument("--rel-gap", type=float, default=0.01, help="relative gap to prove (default 0.01)")
    s.add_argument("--threads", type=int, default=1, help="solver threads (default 1)")
    s.add_argument("--seed", type=seed_arg, default=0, help="synthetic rounds' seed (default 0)")
    s.add_argument("--objective", default="throughput=1,jct=1,queue=1,reconfig=1",
                   help="term=weight list (default: arena's)")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.set_defaults(func=run_solver_bench)

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

    q = sub.add_parser("policies", help="all policies on one workload, side by side",
                       description="Every policy on the same workload, truth oracle and reconfiguration cost "
                                   "model, side by side (run out by default), plus a comparison figure; spreads "
                                   "over MPI ranks under mpiexec -n K.")
    from .simulate import add_outages_arg, add_perf_runtime_arg, add_profile_store_arg, add_workload_args
    add_workload_args(q)
    add_outages_arg(q)
    q.add_argument("--reconfig-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="move cost model for every policy: preset=arena (default) or preset=realistic, and "
                        "field overrides, e.g. restart_s=60 (repeatable)")
    from ..policy import policy_names
    q.add_argument("--policy", action="append", metavar="[LABEL=]NAME",
                   help=f"policy, one of {', '.join(policy_names())} "
                        f"(repeatable; default {', '.join(DEFAULT_POLICIES)}); LABEL=NAME runs a variant of "
                        f"NAME under its own label, e.g. arena-ms=arena with --policy-opt arena-ms:w_makespan=10, "
                        f"beside the default")
    q.add_argument("--policy-opt", action="append", default=[], metavar="POLICY:KEY=VALUE",
                   help="option for one policy (its label), e.g. arena:w_jct=2 (repeatable)")
    q.add_argument("--rounds", type=int, default=None, help="horizon in rounds (default: the instance's)")
    q.add_argument("--no-run-out", action="store_true", help="stop at the horizon (no run-out metrics)")
    q.add_argument("--perf", default=None,
                   help="performance model the optimizing policies decide with (default analytic, the one "
                        "that ranks grids best); online = analytic corrected by the running jobs' measured "
                        "iterations: arena and sia-ap decided better with it on philly, venus, pai and "
                        "overloaded (docs/engine.md), but replay slower; table = the oracle's own measurements, "
                        "the published comparison's mode")
    add_profile_store_arg(q)
    add_perf_runtime_arg(q)
    seeds = q.add_mutually_exclusive_group()
    seeds.add_argument("--seed", type=seed_arg, default=0, help="instance and policy seed (default 0)")
    seeds.add_argument("--seeds", default=None, metavar="LIST",
                       help="run every policy once per seed (0-4, or 0,1,7) and report each metric's mean, "
                            "sd, min and max over the seeds, and every policy's average JCT against "
                            "--baseline's, paired seed by seed (geometric mean with a 95%% interval)")
    q.add_argument("--baseline", default=None, metavar="LABEL",
                   help="with --seeds: the policy label the others are compared with (default: the first)")
    q.add_argument("--json", action="store_true", help="print JSON instead of a table")
    q.add_argument("--out", default=None, help="directory for results.json/.csv and comparison.png "
                                               "(with --seeds also aggregate.csv and one folder per seed)")
    q.add_argument("--quiet", action="store_true", help="no progress lines")
    q.set_defaults(func=run_policy_bench)

    from .bound import register as register_bound
    register_bound(sub)


# ----------------------------------------------------------------------------- solver
def _pct(values, q):
    import numpy as np
    return float(np.percentile(values, q)) if len(values) else math.nan


def solver_bench(gpus: int, jobs: int, backends, repeat: int, time_limit_s: float, rel_gap: float,
                 threads: int = 1, seed: int = 0, weights: dict | None = None, log=None) -> list[dict]:
    """Rows of the solver benchmark (see module doc)."""
    import numpy as np

    from instances.errors import InputError

    from ..formulation import build_model, synthetic_round_data
    from ..objectives import parse_objective
    from ..solvers import SolverOptions, make_backend
    from ..solvers.base import BackendUnavailable

    if gpus < 8 or jobs < 1 or repeat < 1:
        raise InputError("need gpus >= 8, jobs >= 1, repeat >= 1", field="gpus")
    objective = parse_objective({}, weights or {"throughput": 1, "jct": 1, "queue": 1, "reconfig": 1})
    rounds = [synthetic_round_data(gpus, jobs, seed, round_index=r) for r in range(repeat)]
    rows = []
    for name in backends:
        backend = make_backend(name, SolverOptions(threads=threads, seed=seed))
        lat, gaps, objs, statuses, builds = [], [], [], {}, []
        note = ""
        for r, data in enumerate(rounds):
            t0 = time.perf_counter()
            model = build_model(data, objective)
            t1 = time.perf_counter()
            try:
                sol = backend.solve(model, time_limit_s, hint=None, rel_gap=rel_gap)
            except BackendUnavailable as e:
                note = str(e)
                break
            t2 = time.perf_counter()
            viol = model.violation(sol.values)
            if viol > 1e-6:
                raise AssertionError(f"backend {name}: solution violates the model by {viol}")
            builds.append(t1 - t0)
            lat.append(t2 - t0)
            gaps.append(sol.gap)
            objs.append(sol.objective)
            statuses[sol.status] = statuses.get(sol.status, 0) + 1
            if log:
                log(f"  {name} round {r}: {t2 - t0:.3f} s, {sol.status}, gap {sol.gap:.4f}")
        warm = lat[1:] if len(lat) > 1 else lat
        rows.append({
            "backend": name, "gpus": gpus, "jobs": jobs,
            "columns": int(rounds[0].n_cols), "rounds": len(lat),
            "cold_latency_s": lat[0] if lat else math.nan,
            "median_latency_s": _pct(warm, 50), "p99_latency_s": _pct(warm, 99),
            "median_build_s": _pct(builds, 50),
            "objective_mean": float(np.mean(objs)) if objs else math.nan,
            "max_gap": float(max(gaps)) if gaps else math.nan,
            "statuses": statuses, "note": note})
    return rows


def _parse_weights(text: str) -> dict:
    from instances.errors import InputError
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        k, sep, v = part.partition("=")
        if k.strip() in out:
            raise InputError(f"term {k.strip()!r} given twice in {text!r}; give it once", field="--objective")
        try:
            out[k.strip()] = float(v)
        except ValueError:
            raise InputError(f"expected term=weight, got {part!r}", field="--objective") from None
        if not sep:
            raise InputError(f"expected term=weight, got {part!r}", field="--objective")
        if not (math.isfinite(out[k.strip()]) and out[k.strip()] >= 0):
            raise InputError(f"a term's weight is a finite number >= 0, got {part!r}", field="--objective")
    return out


def _check_synthetic_args(args, rounds_flag: str) -> None:
    """The synthetic benches' sizes and solver limits, each refused by its own flag before
    any work (``rounds_flag``: ``--repeat`` or ``--rounds``)."""
    from instances.cluster import MAX_CLUSTER_GPUS
    from instances.errors import InputError
    from instances.limits import check_time
    rounds = getattr(args, rounds_flag.lstrip("-"))
    for flag, v, lo, hi in (("--gpus", args.gpus, 8, MAX_CLUSTER_GPUS), ("--jobs", args.jobs, 1, MAX_BENCH_JOBS),
                            (rounds_flag, rounds, 1, None)):
        if v < lo or (hi is not None and v > hi):
            raise InputError(f"must be {'>= ' + str(lo) if hi is None else f'in {lo}..{hi:,}'}, got {v}", field=flag)
    if not (math.isfinite(args.time_limit) and args.time_limit > 0):
        raise InputError(f"must be a finite number of seconds > 0, got {args.time_limit}", field="--time-limit")
    check_time(args.time_limit, field="--time-limit")
    if not (math.isfinite(args.rel_gap) and 0 <= args.rel_gap < 1):
        raise InputError(f"must be in [0, 1), got {args.rel_gap}", field="--rel-gap")
    if getattr(args, "threads", 1) < 1:
        raise InputError(f"must be >= 1, got {args.threads}", field="--threads")
    from ..solvers.base import available_cores
    if getattr(args, "threads", 1) > available_cores():
        raise InputError(f"must be at most the {available_cores()} CPU core(s) this process may use, got "
                         f"{args.threads}", field="--threads")


def run_solver_bench(args) -> int:
    from ..solvers.base import BACKENDS
    _check_synthetic_args(args, "--repeat")
    weights = _parse_weights(args.objective)
    backends = args.backend or list(DEFAULT_BENCH_BACKENDS)
    with fields_as_flags({"backend": "--backend"}):
        for name in backends:                      # an unknown name fails before any work
            BACKENDS.get(name)
    log = None if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    if log:
        log(f"bench solver: {args.gpus} GPUs, {args.jobs} jobs, {args.repeat} rounds, backends {', '.join(backends)}")
    rows = solver_bench(args.gpus, args.jobs, backends, args.repeat, args.time_limit, args.rel_gap,
                        args.threads, args.seed, weights, log)
    if args.json:
        print(dumps(rows, indent=2))
        return 0
    from ..solvers.base import STATUSES
    seen = [st for st in STATUSES if any(r["statuses"].get(st) for r in rows if not r["note"])]
    print(f"{'backend':<12} {'cols':>7} {'cold s':>8} {'median s':>9} {'p99 s':>8} {'build s':>8} {'objective':>11} "
          f"{'max gap':>8}" + "".join(f" {st:>10}" for st in seen))
    for r in rows:
        if r["note"]:
            print(f"{r['backend']:<12} unavailable: {r['note']}")
            continue
        print(f"{r['backend']:<12} {r['columns']:>7} {r['cold_latency_s']:>8.3f} {r['median_latency_s']:>9.3f} "
              f"{r['p99_latency_s']:>8.3f} {r['median_build_s']:>8.3f} {r['objective_mean']:>11.2f} "
              f"{r['max_gap']:>8.4f}" + "".join(f" {r['statuses'].get(st, 0):>10}" for st in seen))
    if seen:
        print(f"(status columns: rounds per solution status out of {args.repeat}; optimal = the gap proved within "
              f"{args.rel_gap:g})")
    return 0


# ----------------------------------------------------------------------------- incremental
def run_incremental_bench(args) -> int:
    from instances.errors import InputError

    from ..incremental import IncrementalConfig
    from ..incremental.yardstick import summarize, yardstick
    from ..objectives import parse_objective
    from ..reconfig import ReconfigCostModel
    from ..solvers import make_backend

    _check_synthetic_args(args, "--rounds")
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
    objective = parse_objective({}, _parse_weights(args.objective))
    log = None if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    if log:
        log(f"bench incremental: {args.gpus} GPUs, {args.jobs} jobs, {args.rounds} rounds after the first; "
            f"moves {per_gpu:g} s/GPU, at most {cap:g} s; MILP backend {args.backend}")
    # Both sides are single-threaded designs; left alone, BLAS's idle worker threads spin on
    # the other core after a call and bill their time to whichever side runs next.
    from threadpoolctl import threadpool_limits

    from ..incremental import kernel
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


# ----------------------------------------------------------------------------- policies
LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def _policy_labels(specs: list[str]) -> dict[str, str]:
    """``--policy`` values (``NAME`` or ``LABEL=NAME``) as {label: policy name}, in order;
    a label names a row, its output folder and its ``--policy-opt`` options."""
    from instances.errors import InputError
    out: dict[str, str] = {}
    for spec in specs:
        label, sep, name = spec.partition("=")
        if not sep:
            name = label
        if not LABEL.fullmatch(label) or not name:
            raise InputError(f"expected NAME or LABEL=NAME (label: letters, digits, _.+-), got {spec!r}",
                             field="--policy")
        if label in out:
            raise InputError(f"policy label {label!r} given twice", field="--policy")
        out[label] = name
    return out


def _policy_options(specs: list[str], policies) -> dict[str, dict]:
    """``--policy-opt LABEL:KEY=VALUE`` per label, values parsed as ``arena simulate``'s
    (int, float, bool or str)."""
    from instances.errors import InputError

    from .simulate import parse_value
    out: dict[str, dict] = {p: {} for p in policies}
    for spec in specs:
        pol, sep, kv = spec.partition(":")
        k, sep2, v = kv.partition("=")
        if not sep or not sep2 or not k:
            raise InputError(f"expected POLICY:KEY=VALUE, got {spec!r}", field="--policy-opt")
        if pol not in out:
            raise InputError(f"--policy-opt for {pol!r}, which is not benchmarked", field="--policy-opt")
        if k in out[pol]:
            raise InputError(f"{pol}:{k} given twice ({out[pol][k]!r} and {parse_value(v)!r}); give it once",
                             field="--policy-opt")
        out[pol][k] = parse_value(v)
    return out


def _mpi_comm():
    """COMM_WORLD when launched by mpiexec with more than one rank, else None."""
    if not any(v in os.environ for v in ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")):
        return None
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    return comm if comm.Get_size() > 1 else None


def write_outputs(rows: list[dict], out_dir, instance_name: str, plugins: tuple = (), *,
                  interrupted: bool = False) -> None:
    import csv
    from dataclasses import asdict
    from pathlib import Path
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    doc = {"instance": instance_name, "rows": rows, "plugins": [asdict(p) for p in plugins]}
    if interrupted:                     # Ctrl-C: the rows so far (each row's end_reason says which ran out)
        doc["interrupted"] = True
    (d / "results.json").write_text(dumps(doc, indent=2, default=str))
    with open(d / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(POLICY_COLUMNS), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    plot_comparison(rows, d / "comparison.png", instance_name)


def plot_comparison(rows: list[dict], path, instance_name: str) -> None:
    """One figure: jobs finished beside jobs never placed, average JCT over every job
    finished in the run-out and over the jobs all finished, the first over the JCT lower
    bound, makespan, reconfigurations per job, GPU-hours lost to moves, the move ledger's
    moves giving way and share of speed-up moves paid back, and decision time, one bar
    per policy."""
    from pathlib import Path

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    common = rows[0].get("jobs_common") if rows else None
    metrics = [("avg_jct_runout_s", "avg JCT, run out, every finished job (h)", 3600.0),
               ("avg_jct_common_s", f"avg JCT on the {common} jobs all finished (h)", 3600.0),
               ("avg_jct_over_bound", "avg JCT over avg JCT alone at fastest", 1.0),
               ("makespan_runout_s", "makespan, run out (h)", 3600.0),
               ("reconfigurations_per_job_runout", "reconfigurations per job", 1.0),
               ("reconfig_gpu_hours_lost_runout", "GPU-hours lost to moves", 1.0),
               ("moves_giving_way", "moves giving way (expected slower for the job)", 1.0),
               ("moves_paid_back_share", "speed-up moves that paid for themselves", 1.0),
               ("decision_time_median_s", "decision time, median (s)", 1.0)]
    fig, grid = plt.subplots(2, 5, figsize=(17, 7.5))
    axes = list(grid.flat)
    names = [r["policy"] for r in rows]
    x = range(len(rows))
    ax = axes[0]
    run_out = all(r.get("jobs_finished_runout") is not None for r in rows)
    fin = [(r["jobs_finished_runout"] if run_out else r.get("jobs_finished")) or 0 for r in rows]
    never = [r.get("jobs_never_placed") or 0 for r in rows]
    ax.bar(x, fin, color="tab:green", label="finished")
    ax.bar(x, never, bottom=fin, color="tab:red", label="never placed")
    ax.set_title(f"jobs finished ({'run out' if run_out else 'by the horizon'}) / never placed", fontsize=9)
    ax.set_xticks(list(x), names, rotation=60, ha="right", fontsize=7)
    ax.legend(fontsize=7)
    colours = [policy_colour(r.get("policy_name", r["policy"])) for r in rows]
    for ax, (key, title, div) in zip(axes[1:], metrics):
        vals = [(r.get(key) if r.get(key) is not None else math.nan) / div for r in rows]
        bars = ax.bar(x, vals, color=colours)
        ax.set_title(title, fontsize=9)
        ax.set_xticks(list(x), names, rotation=60, ha="right", fontsize=7)
        for b, v in zip(bars, vals):
            if math.isfinite(v):
                ax.annotate(f"{v:.0f}" if v >= 10 else f"{v:.2f}", (b.get_x() + b.get_width() / 2, v),
                            ha="center", va="bottom", fontsize=6)
    perf = decided_with(rows)
    moves = rows[0].get("move_costs") if rows else None
    outages = rows[0].get("outages") if rows else None
    fig.suptitle(f"policies on {instance_name}: same oracle, move costs {moves}, decisions from {perf}"
                 + (f", node outages {Path(outages).name} (evictions: "
                    f"{', '.join(str(r.get('evictions') or 0) for r in rows)})" if outages else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(v, width, prec=0):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return f"{'-':>{width}}"
    if isinstance(v, float):
        return f"{v:>{width}.{prec}f}"
    return f"{v:>{width}}"


def run_policy_bench(args) -> int:
    from instances.errors import InputError

    from ..reconfig import ReconfigCostModel
    from .simulate import build_policy, parse_options
    names = _policy_labels(args.policy or list(DEFAULT_POLICIES))
    policies = list(names)
    options = _policy_options(args.policy_opt, policies)
    for label in policies:          # names, options and inputs are checked before any simulation runs
        try:
            build_policy(names[label], options[label])
        except InputError as e:
            if label == names[label]:
                raise
            raise InputError(f"label {label!r}: {e.reason}", field=e.field) from None
    reconfig_opts = parse_options(args.reconfig_opt, "--reconfig-opt")
    try:
        ReconfigCostModel.from_options(reconfig_opts)                 # checked before any work
    except (TypeError, ValueError) as e:
        raise InputError(str(e), field="--reconfig-opt") from None
    if args.perf is not None:
        from estimators.perf import KINDS
        with fields_as_flags({"kind": "--perf"}):
            KINDS.get(args.perf)
    if args.profile_store is not None:
        from estimators.perf import open_profile_store
        open_profile_store(args.profile_store, "--profile-store")       # before any simulation
    if args.rounds is not None and args.rounds < 1:
        raise InputError(f"must be >= 1, got {args.rounds}", field="--rounds")
    from ..simulator import SimConfig
    if args.rounds is not None and args.rounds > SimConfig.max_rounds:
        raise InputError(f"the horizon of {args.rounds:,} rounds exceeds the safety limit of "
                         f"{SimConfig.max_rounds:,} rounds", field="--rounds")
    from .bench_seeds import run_seeded_bench, seeds_arg
    seeds = seeds_arg(args, policies)
    workload = workload_args(args)
    inst = build_workload(workload)
    from .simulate import load_outages_arg, reconfig_for
    load_outages_arg(args.outages, inst.cluster)                      # checked before any simulation
    if args.out:
        from instances.paths import check_output_dir
        check_output_dir(args.out, "--out")
    comm = _mpi_comm()
    rank = comm.Get_rank() if comm is not None else 0
    quiet = args.quiet or args.json
    log = None if quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    if log and rank == 0:
        log(f"bench policies on {inst.name} ({len(inst.jobs)} jobs, {inst.cluster.num_gpus} GPUs, move costs "
            f"{reconfig_for(inst, reconfig_opts).preset}): {', '.join(policies)}"
            + (f" over {comm.Get_size()} MPI ranks" if comm is not None else ""))
    if seeds is not None:
        return run_seeded_bench(args, seeds, policies, options, names, reconfig_opts, log, comm)
    from .simulate import Interrupt
    with Interrupt("arena bench policies") as interrupt:
        rows = policy_bench(workload, policies, options, args.rounds, not args.no_run_out, args.perf, reconfig_opts,
                            args.seed, args.out, log, comm, names, args.profile_store, args.perf_runtime,
                            stop=interrupt)
    if rows is None:
        return Interrupt.EXIT_STATUS if interrupt.requested else 0
    interrupted = interrupt.requested or any(r.get("end_reason") == "interrupted" for r in rows)
    add_jct_bound(rows, inst, options)
    if args.out:
        write_outputs(rows, args.out, inst.name, args.plugins, interrupted=interrupted)
    if interrupted:
        done = [r["policy"] for r in rows if r.get("end_reason") != "interrupted"]
        print(f"arena bench policies: interrupted (Ctrl-C): {len(done)} of {len(policies)} policies ran to their "
              f"end ({', '.join(done) or 'none'}); "
              + (f"the rows so far are in {args.out}/ (results.json: interrupted true, each row's end_reason)"
                 if args.out else "the rows so far follow"), file=sys.stderr)
    if args.json:
        print(dumps(rows, indent=2, default=str))
        return Interrupt.EXIT_STATUS if interrupted else 0
    print(f"{'policy':<18} {'finished':>8} {'never':>5} {'JCT runout s':>12} {'/bound':>6} {'makespan s':>11} "
          f"{'JCT common s':>12} {'util':>5} {'reconf/job':>10} {'GPU-h lost':>10} {'paid':>5} {'decide s':>9}")
    for r in rows:
        print(f"{r['policy']:<18} {_fmt(r['jobs_finished'], 8)} {_fmt(r['jobs_never_placed'], 5)} "
              f"{_fmt(r['avg_jct_runout_s'], 12)} {_fmt(r['avg_jct_over_bound'], 6, 2)} "
              f"{_fmt(r['makespan_runout_s'], 11)} "
              f"{_fmt(r['avg_jct_common_s'], 12)} {_fmt(r['gpu_util'], 5, 3)} "
              f"{_fmt(r['reconfigurations_per_job_runout'], 10, 2)} {_fmt(r['reconfig_gpu_hours_lost_runout'], 10, 1)} "
              f"{_fmt(r['moves_paid_back_share'], 5, 2)} {_fmt(r['decision_time_median_s'], 9, 3)}")
    if rows:
        print(f"finished: by the horizon; never: jobs never placed (run out); JCT runout: over every job that "
              f"finished in the run-out; /bound: that over every job's JCT alone on the cluster at its fastest "
              f"shape (arena bench bound), when every job finished; "
              f"JCT common: over the {rows[0]['jobs_common']} jobs every policy finished; "
              f"reconf/job and GPU-h lost: moves and resumes per job of the instance, and GPU-hours held during "
              f"their downtime, whole run; paid: share of the moves expected to speed their job up that paid for "
              f"themselves (progress since >= what staying would have made; moves.csv has every move); "
              f"decisions from {decided_with(rows)}, move costs {rows[0]['move_costs']}")
    if args.out:
        print(f"wrote {args.out}/results.json, results.csv, comparison.png")
    return Interrupt.EXIT_STATUS if interrupted else 0

