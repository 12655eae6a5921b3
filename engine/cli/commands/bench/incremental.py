"""``arena bench incremental``: the incremental search's objective against the full
per-round MILP's, and both decision times, over synthetic rounds (the group's doc:
``engine/cli/commands/bench``)."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

from ...flags import add_config_flags, config_flags, config_values, fields_as_flags
from ...jsonout import dumps
from .synthetic import check_synthetic, gpus_field, jobs_field, objective_field, round_objective, seed_field


@dataclass(frozen=True)
class IncrementalBench:
    """``arena bench incremental``'s options, validated; each field a flag sets carries it
    (``--help`` lists them in this order; engine/cli/flags.py). ``queued`` ..
    ``move_budget_gpus`` are the search's ``IncrementalConfig`` (``incremental_config``)."""
    gpus: int = gpus_field()
    jobs: int = jobs_field()
    rounds: int = field(default=5, metadata={"flag": "--rounds",
                                             "help": "rounds compared after the first (default %(default)s)"})
    backend: str = field(default="auto", metadata={"flag": "--backend",
                                                   "help": "the MILP's backend (default %(default)s)"})
    time_limit_s: float = field(default=30.0, metadata={"flag": "--time-limit",
                                                        "help": "the MILP's per-round time limit, s"})
    rel_gap: float = field(default=0.01, metadata={"flag": "--rel-gap",
                                                   "help": "the MILP's relative gap (default %(default)s)"})
    seed: int = seed_field()
    objective: str = objective_field()
    # None: the simulator's ReconfigCostModel's (move_costs)
    move_cost_per_gpu_s: float | None = field(default=None, metadata={
        "flag": "--move-cost-per-gpu",
        "help": "move downtime per GPU of the new grid, s (default: the simulator's ReconfigCostModel)"})
    move_cost_cap_s: float | None = field(default=None, metadata={
        "flag": "--move-cost-cap", "help": "move downtime cap, s (default: the simulator's ReconfigCostModel)"})
    queued: str = field(default="all", metadata={
        "flag": "--queued", "help": "queued jobs' candidates: all or small (default %(default)s)"})
    other_type: str = field(default="same", metadata={
        "flag": "--other-type",
        "help": "running jobs' candidates on another GPU type: same (GPU count) or any (default %(default)s)"})
    move_budget_jobs: float = field(default=1.0, metadata={
        "flag": "--move-budget-jobs", "help": "fraction of running jobs that may move"})
    move_budget_gpus: float = field(default=1.0, metadata={
        "flag": "--move-budget-gpus", "help": "fraction of GPUs that may move"})
    follow: str = field(default="incremental", metadata={
        "flag": "--follow", "choices": ("incremental", "milp"),
        "help": "whose decision the next round starts from (default %(default)s)"})
    json: bool = field(default=False, metadata={"flag": "--json",
                                                "help": "print JSON (rows and summary) instead of a table"})

    def __post_init__(self):
        from engine.decide.solvers import make_backend
        from instances.limits import check_time
        check_synthetic(self, "rounds")
        make_backend(self.backend)                  # an unknown name fails before any work
        self.incremental_config()
        for name in ("move_cost_per_gpu_s", "move_cost_cap_s"):     # within the bound on times (limits.py)
            if getattr(self, name) is not None:
                check_time(getattr(self, name), field=name)

    def incremental_config(self):
        """The search's ``IncrementalConfig`` (its ``ValueError``: an ``InputError`` naming the field)."""
        from engine.decide.incremental import IncrementalConfig
        from instances.errors import InputError
        try:
            return IncrementalConfig(queued=self.queued, other_type=self.other_type,
                                     move_budget_jobs=self.move_budget_jobs, move_budget_gpus=self.move_budget_gpus)
        except ValueError as e:                 # "queued must be ...": the field, then the reason
            name, _, reason = str(e).partition(" ")
            raise InputError(reason, field=name) from None

    def move_costs(self) -> tuple[float, float]:
        """(move downtime per GPU, its cap), s: the flags' or the simulator's defaults."""
        from engine.core.reconfig import ReconfigCostModel
        defaults = ReconfigCostModel()
        return (defaults.replan_per_gpu_s if self.move_cost_per_gpu_s is None else self.move_cost_per_gpu_s,
                defaults.replan_cap_s if self.move_cost_cap_s is None else self.move_cost_cap_s)


INCREMENTAL_BENCH_FLAGS = config_flags(IncrementalBench)


def register(sub) -> None:
    i = sub.add_parser("incremental", help="the incremental search against the full MILP, round by round",
                       description="The incremental search's objective as a fraction of the full per-round MILP's "
                                   "(same c @ x) and both decision times, over synthetic rounds that each start "
                                   "from the previous round's allocation.")
    add_config_flags(i, IncrementalBench)
    i.set_defaults(func=run_incremental_bench)


def run_incremental_bench(args) -> int:
    from engine.decide.incremental.yardstick import summarize, yardstick

    with fields_as_flags(INCREMENTAL_BENCH_FLAGS):
        o = IncrementalBench(**config_values(args, IncrementalBench))
        config = o.incremental_config()
    per_gpu, cap = o.move_costs()
    objective = round_objective(o.objective)
    log = None if o.json else (lambda m: print(m, file=sys.stderr, flush=True))
    if log:
        log(f"bench incremental: {o.gpus} GPUs, {o.jobs} jobs, {o.rounds} rounds after the first; "
            f"moves {per_gpu:g} s/GPU, at most {cap:g} s; MILP backend {o.backend}")
    # Both sides are single-threaded designs; left alone, BLAS's idle worker threads spin on
    # the other core after a call and bill their time to whichever side runs next.
    from threadpoolctl import threadpool_limits

    from engine.decide.incremental import kernel
    load_s = kernel.warm_up()
    if log:
        log(f"  the search's compiled kernels loaded in {load_s:.2f} s (once per process, not in the round times)")
    with threadpool_limits(limits=1):
        rows = yardstick(o.gpus, o.jobs, o.rounds, objective, config, backend=o.backend,
                         time_limit_s=o.time_limit_s, rel_gap=o.rel_gap, seed=o.seed,
                         reconfig_s_per_gpu=per_gpu, reconfig_cap_s=cap, follow=o.follow, log=log)
    summary = summarize(rows)
    summary.update(kernel_load_s=load_s, gpus=o.gpus, jobs=o.jobs, move_cost_per_gpu_s=per_gpu,
                   move_cost_cap_s=cap,
                   backend=o.backend, follow=o.follow, queued=o.queued, other_type=o.other_type,
                   move_budget_jobs=o.move_budget_jobs, move_budget_gpus=o.move_budget_gpus)
    if o.json:
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


