"""``arena bench solver``: round latency (model build + solve), objective and proved gap per
solver backend on a sequence of synthetic rounds (the group's doc: ``engine/cli/commands/bench``)."""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field

from ...flags import add_config_flags, config_flags, config_values, fields_as_flags
from ...jsonout import dumps
from .synthetic import check_synthetic, gpus_field, jobs_field, objective_field, parse_weights, seed_field

DEFAULT_BENCH_BACKENDS = ("auto", "lagrangian", "highs-lp", "highs", "greedy")


@dataclass(frozen=True)
class SolverBench:
    """``arena bench solver``'s options, validated; each field a flag sets carries it
    (``--help`` lists them in this order; engine/cli/flags.py)."""
    gpus: int = gpus_field()
    jobs: int = jobs_field()
    backends: tuple[str, ...] = field(default=DEFAULT_BENCH_BACKENDS, metadata={
        "flag": "--backend", "action": "append",
        "help": f"backend (repeatable; default {', '.join(DEFAULT_BENCH_BACKENDS)})"})
    repeat: int = field(default=5, metadata={"flag": "--repeat",
                                             "help": "rounds in the sequence (default %(default)s)"})
    time_limit_s: float = field(default=30.0, metadata={"flag": "--time-limit",
                                                        "help": "per-round solver time limit, s"})
    rel_gap: float = field(default=0.01, metadata={"flag": "--rel-gap",
                                                   "help": "relative gap to prove (default %(default)s)"})
    threads: int = field(default=1, metadata={"flag": "--threads", "help": "solver threads (default %(default)s)"})
    seed: int = seed_field()
    objective: str = objective_field()
    json: bool = field(default=False, metadata={"flag": "--json", "help": "print JSON instead of a table"})

    def __post_init__(self):
        from engine.decide.solvers.base import BACKENDS, available_cores
        from instances.errors import InputError
        object.__setattr__(self, "backends", tuple(self.backends))
        check_synthetic(self, "repeat")
        if self.threads < 1:
            raise InputError(f"must be >= 1, got {self.threads}", field="threads")
        if self.threads > available_cores():
            raise InputError(f"must be at most the {available_cores()} CPU core(s) this process may use, got "
                             f"{self.threads}", field="threads")
        for name in self.backends:                  # an unknown name fails before any work
            try:
                BACKENDS.get(name)
            except InputError as e:
                raise InputError(e.reason, field="backends") from None


SOLVER_BENCH_FLAGS = config_flags(SolverBench)


def register(sub) -> None:
    s = sub.add_parser("solver", help="round latency and gap per solver backend on synthetic rounds",
                       description="Round latency (model build + solve), objective and proved gap per solver "
                                   "backend on a sequence of synthetic scheduling rounds.")
    add_config_flags(s, SolverBench)
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
                log(f"  {name} round {r}: {t2 - t0:.3f} s, {sol.status}, gap {_gap(sol.gap, 0)}")
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



def _gap(gap: float, width: int) -> str:
    """A proved gap as the table shows it; ``-`` where none was proved (a backend with no
    bound, the greedy one: its gap is infinite, ``null`` in ``--json``)."""
    return f"{gap:>{width}.4f}" if math.isfinite(gap) else f"{'-':>{width}}"


def run_solver_bench(args) -> int:
    with fields_as_flags(SOLVER_BENCH_FLAGS):
        o = SolverBench(**config_values(args, SolverBench))
    log = None if o.json else (lambda m: print(m, file=sys.stderr, flush=True))
    if log:
        log(f"bench solver: {o.gpus} GPUs, {o.jobs} jobs, {o.repeat} rounds, backends {', '.join(o.backends)}")
    rows = solver_bench(o.gpus, o.jobs, o.backends, o.repeat, o.time_limit_s, o.rel_gap, o.threads, o.seed,
                        parse_weights(o.objective), log)
    if o.json:
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
              f"{_gap(r['max_gap'], 8)}" + "".join(f" {r['statuses'].get(st, 0):>10}" for st in seen))
    if any(not r["note"] and not math.isfinite(r["max_gap"]) for r in rows):
        print("(max gap -: no gap proved; the backend found a solution without a bound on the best one)")
    if seen:
        print(f"(status columns: rounds per solution status out of {o.repeat}; optimal = the gap proved within "
              f"{o.rel_gap:g})")
    return 0


