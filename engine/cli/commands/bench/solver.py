"""``arena bench solver``: round latency (model build + solve), objective and proved gap per
solver backend on a sequence of synthetic rounds (the group's doc: ``engine/cli/commands/bench``)."""
from __future__ import annotations

import math
import sys
import time

from ...common import seed_arg
from ...flags import fields_as_flags
from ...jsonout import dumps
from .synthetic import check_synthetic_args, parse_weights

DEFAULT_BENCH_BACKENDS = ("auto", "lagrangian", "highs-lp", "highs", "greedy")


def register(sub) -> None:
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


def _pct(values, q):
    import numpy as np
    return float(np.percentile(values, q)) if len(values) else math.nan


def solver_bench(gpus: int, jobs: int, backends, repeat: int, time_limit_s: float, rel_gap: float,
                 threads: int = 1, seed: int = 0, weights: dict | None = None, log=None) -> list[dict]:
    """Rows of the solver benchmark (see module doc)."""
    import numpy as np

    from engine.decide.formulation import build_model, synthetic_round_data
    from engine.decide.objectives import parse_objective
    from engine.decide.solvers import SolverOptions, make_backend
    from engine.decide.solvers.base import BackendUnavailable
    from instances.errors import InputError

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



def run_solver_bench(args) -> int:
    from engine.decide.solvers.base import BACKENDS
    check_synthetic_args(args, "--repeat")
    weights = parse_weights(args.objective)
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
    from engine.decide.solvers.base import STATUSES
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


