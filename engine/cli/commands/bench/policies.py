"""``arena bench policies``: every policy on the same workload, truth oracle and
reconfiguration cost model, side by side, plus a comparison figure (the group's doc:
``engine/cli/commands/bench``; the runs: ``policy_runs.py``; over several seeds:
``seeds.py``)."""
from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field

from ...common import seed_arg
from ...flags import add_config_flags, config_flags, config_values, fields_as_flags
from ...jsonout import dumps
from .policy_runs import (
    POLICY_COLUMNS,
    add_jct_bound,
    build_workload,
    decided_with,
    policy_bench,
    policy_colour,
    workload_args,
)

DEFAULT_POLICIES = ("arena", "arena-incremental", "suika", "sia", "sia-ap", "gavel", "gavel-ap", "elasticflow-ls",
                    "elasticflow-ls-ap", "fcfs")


def _policy_help() -> str:
    """``--policy``'s help: the registered policies (plug-ins' included) when the parser is built."""
    from engine.core.policy import policy_names
    return (f"policy, one of {', '.join(policy_names())} (repeatable; default {', '.join(DEFAULT_POLICIES)}); "
            f"LABEL=NAME runs a variant of NAME under its own label, e.g. arena-ms=arena with --policy-opt "
            f"arena-ms:w_makespan=10, beside the default")


@dataclass(frozen=True)
class PolicyBench:
    """``arena bench policies``' own options (beside the workload's, ``--outages``,
    ``--profile-store`` and ``--perf-runtime``, shared with ``arena simulate``), validated
    before any simulation; each field a flag sets carries it (engine/cli/flags.py). The
    parsed forms: ``names`` (label -> policy), ``options`` (label -> its options),
    ``reconfig`` (the move cost model's options), ``seed_list`` (``--seeds``, or None)."""
    reconfig_opts: tuple[str, ...] = field(default=(), metadata={
        "flag": "--reconfig-opt", "action": "append", "metavar": "KEY=VALUE",
        "help": "move cost model for every policy: preset=arena (default) or preset=realistic, and field "
                "overrides, e.g. restart_s=60 (repeatable)"})
    policies: tuple[str, ...] = field(default=DEFAULT_POLICIES, metadata={
        "flag": "--policy", "action": "append", "metavar": "[LABEL=]NAME", "help": _policy_help})
    policy_opts: tuple[str, ...] = field(default=(), metadata={
        "flag": "--policy-opt", "action": "append", "metavar": "POLICY:KEY=VALUE",
        "help": "option for one policy (its label), e.g. arena:w_jct=2 (repeatable)"})
    rounds: int | None = field(default=None, metadata={
        "flag": "--rounds", "help": "horizon in rounds (default: the instance's)"})
    no_run_out: bool = field(default=False, metadata={
        "flag": "--no-run-out", "help": "stop at the horizon (no run-out metrics)"})
    perf: str | None = field(default=None, metadata={
        "flag": "--perf",
        "help": "performance model the optimizing policies decide with (default analytic, the one that ranks "
                "grids best); online = analytic corrected by the running jobs' measured iterations: arena and "
                "sia-ap decided better with it on philly, venus, pai and overloaded (docs/engine.md), but replay "
                "slower; table = the oracle's own measurements, the published comparison's mode"})
    # (--profile-store and --perf-runtime come here: common.py's, shared with arena simulate)
    seed: int = field(default=0, metadata={"flag": "--seed", "type": seed_arg,
                                           "help": "instance and policy seed (default %(default)s)"})
    seeds: str | None = field(default=None, metadata={
        "flag": "--seeds", "metavar": "LIST",
        "help": "run every policy once per seed (0-4, or 0,1,7) and report each metric's mean, sd, min and "
                "max over the seeds, and every policy's average JCT against --baseline's, paired seed by seed "
                "(geometric mean with a 95%% interval)"})
    baseline: str | None = field(default=None, metadata={
        "flag": "--baseline", "metavar": "LABEL",
        "help": "with --seeds: the policy label the others are compared with (default: the first)"})
    json: bool = field(default=False, metadata={"flag": "--json", "help": "print JSON instead of a table"})
    out: str | None = field(default=None, metadata={
        "flag": "--out", "help": "directory for results.json/.csv and comparison.png (with --seeds also "
                                 "aggregate.csv and one folder per seed)"})
    quiet: bool = field(default=False, metadata={"flag": "--quiet", "help": "no progress lines"})
    # parsed from the above (set by __post_init__)
    names: dict = field(init=False, repr=False, compare=False)
    options: dict = field(init=False, repr=False, compare=False)
    reconfig: dict = field(init=False, repr=False, compare=False)
    seed_list: list[int] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        from engine.core.reconfig import ReconfigCostModel
        from engine.sim.simulator import SimConfig
        from instances.errors import InputError

        from ...common import build_policy, parse_options
        from .seeds import seed_list
        for name in ("reconfig_opts", "policies", "policy_opts"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        names = _policy_labels(self.policies)
        options = policy_options(self.policy_opts, list(names))
        for label in names:          # names, options and inputs are checked before any simulation runs
            try:
                build_policy(names[label], options[label], name_flag="policies", opt_flag="policy_opts")
            except InputError as e:
                if label == names[label]:
                    raise
                raise InputError(f"label {label!r}: {e.reason}", field=e.field) from None
        reconfig = parse_options(list(self.reconfig_opts), "reconfig_opts")
        try:
            ReconfigCostModel.from_options(reconfig)
        except (TypeError, ValueError) as e:
            raise InputError(str(e), field="reconfig_opts") from None
        if self.perf is not None:
            from estimators.perf import KINDS
            with fields_as_flags({"kind": "perf"}):
                KINDS.get(self.perf)
        if self.rounds is not None and self.rounds < 1:
            raise InputError(f"must be >= 1, got {self.rounds}", field="rounds")
        if self.rounds is not None and self.rounds > SimConfig.max_rounds:
            raise InputError(f"the horizon of {self.rounds:,} rounds exceeds the safety limit of "
                             f"{SimConfig.max_rounds:,} rounds", field="rounds")
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "options", options)
        object.__setattr__(self, "reconfig", reconfig)
        object.__setattr__(self, "seed_list", seed_list(self.seeds, self.baseline, list(names)))


POLICY_BENCH_FLAGS = config_flags(PolicyBench)
_SEED_FIELDS = ("seed", "seeds")                            # one or the other
_LAST_FIELDS = ("baseline", "json", "out", "quiet")         # after them in --help


def register(sub) -> None:
    q = sub.add_parser("policies", help="all policies on one workload, side by side",
                       description="Every policy on the same workload, truth oracle and reconfiguration cost "
                                   "model, side by side (run out by default), plus a comparison figure; spreads "
                                   "over MPI ranks under mpiexec -n K, and over Slurm tasks under srun -n K.")
    from ...common import add_outages_arg, add_perf_runtime_arg, add_profile_store_arg, add_workload_args
    add_workload_args(q)
    add_outages_arg(q)
    add_config_flags(q, PolicyBench, skip=_SEED_FIELDS + _LAST_FIELDS)
    add_profile_store_arg(q)
    add_perf_runtime_arg(q)
    add_config_flags(q.add_mutually_exclusive_group(), PolicyBench, only=_SEED_FIELDS)
    add_config_flags(q, PolicyBench, only=_LAST_FIELDS)
    q.set_defaults(func=run_policy_bench)


LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def _policy_labels(specs) -> dict[str, str]:
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
                             field="policies")
        if label in out:
            raise InputError(f"policy label {label!r} given twice", field="policies")
        out[label] = name
    return out


def policy_options(specs: list[str], policies) -> dict[str, dict]:
    """``--policy-opt LABEL:KEY=VALUE`` per label, values parsed as ``arena simulate``'s
    (int, float, bool or str)."""
    from instances.errors import InputError

    from ...common import parse_value
    out: dict[str, dict] = {p: {} for p in policies}
    for spec in specs:
        pol, sep, kv = spec.partition(":")
        k, sep2, v = kv.partition("=")
        if not sep or not sep2 or not k:
            raise InputError(f"expected POLICY:KEY=VALUE, got {spec!r}", field="policy_opts")
        if pol not in out:
            raise InputError(f"--policy-opt for {pol!r}, which is not benchmarked", field="policy_opts")
        if k in out[pol]:
            raise InputError(f"{pol}:{k} given twice ({out[pol][k]!r} and {parse_value(v)!r}); give it once",
                             field="policy_opts")
        out[pol][k] = parse_value(v)
    return out


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


def check_policies_on(o: PolicyBench, inst) -> None:
    """Every policy against the instance before any simulation: one it cannot decide there,
    or an option it would not read there, is refused (``check_policy_on``)."""
    from instances.errors import InputError

    from ...common import build_policy, check_policy_on, instance_workload
    workload = instance_workload(inst, run_out=not o.no_run_out)
    for label, name in o.names.items():
        try:
            check_policy_on(build_policy(name, o.options[label]), workload)
        except InputError as e:
            if label == name:
                raise
            raise InputError(f"label {label!r}: {e.reason}", field=e.field) from None


def run_policy_bench(args) -> int:
    with fields_as_flags(POLICY_BENCH_FLAGS):
        o = PolicyBench(**config_values(args, PolicyBench))
    if args.profile_store is not None:
        from estimators.perf import open_profile_store
        open_profile_store(args.profile_store, "--profile-store")       # before any simulation
    workload = workload_args(args, o.seed)
    inst = build_workload(workload)
    from ...common import load_outages_arg, reconfig_for
    load_outages_arg(args.outages, inst.cluster)                      # checked before any simulation
    check_policies_on(o, inst)
    if o.out:
        from instances.paths import check_output_dir
        check_output_dir(o.out, POLICY_BENCH_FLAGS["out"])
    move_costs = reconfig_for(inst, o.reconfig)              # (an instance of the Sia artifact: its own preset)
    from . import spread
    comm = spread.comm()
    rc = _run_spread(args, o, inst, workload, move_costs, comm)
    spread.finish(comm)                       # (not after an error: rank 0 hears of it, see spread.py)
    return rc


def _run_spread(args, o: PolicyBench, inst, workload, move_costs, comm) -> int:
    """The runs (this process's share of them under ``mpiexec``/``srun``, ``spread.py``) and,
    on rank 0, the rows."""
    policies = list(o.names)
    from .seeds import run_seeded_bench
    from .spread import SlurmTasks
    rank = comm.Get_rank() if comm is not None else 0
    quiet = o.quiet or o.json
    log = None if quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    if log and rank == 0:
        log(f"bench policies on {inst.name} ({len(inst.jobs)} jobs, {inst.cluster.num_gpus} GPUs, move costs "
            f"{move_costs.preset}): {', '.join(policies)}"
            + (f" over {comm.Get_size()} {'Slurm tasks' if isinstance(comm, SlurmTasks) else 'MPI ranks'}"
               if comm is not None else ""))
    if o.seed_list is not None:
        return run_seeded_bench(args, o, log, comm)
    from ...progress import Interrupt
    with Interrupt("arena bench policies") as interrupt:
        rows = policy_bench(workload, policies, o.options, o.rounds, not o.no_run_out, o.perf, o.reconfig,
                            o.seed, o.out, log, comm, o.names, args.profile_store, args.perf_runtime,
                            stop=interrupt)
    if rows is None:
        return Interrupt.EXIT_STATUS if interrupt.requested else 0
    interrupted = interrupt.requested or any(r.get("end_reason") == "interrupted" for r in rows)
    add_jct_bound(rows, inst, o.options)
    if o.out:
        write_outputs(rows, o.out, inst.name, args.plugins, interrupted=interrupted)
    if interrupted:
        done = [r["policy"] for r in rows if r.get("end_reason") != "interrupted"]
        print(f"arena bench policies: interrupted (Ctrl-C): {len(done)} of {len(policies)} policies ran to their "
              f"end ({', '.join(done) or 'none'}); "
              + (f"the rows so far are in {o.out}/ (results.json: interrupted true, each row's end_reason)"
                 if o.out else "the rows so far follow"), file=sys.stderr)
    if o.json:
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
    if o.out:
        print(f"wrote {o.out}/results.json, results.csv, comparison.png")
    return Interrupt.EXIT_STATUS if interrupted else 0

