"""`arena simulate`: replay a workload on a cluster under one policy.

Examples::

    arena simulate                                    # the demo instance under fcfs
    arena simulate --instance arena-philly --policy fcfs --run-out
    arena simulate --instance demo --policy arena --perf analytic --policy-opt time_limit_s=5
    arena simulate --cluster sim_cluster_spec.json --trace simulate_trace_philly.csv \\
        --trace-opt iteration_divisor=5 --rounds 2000
    arena simulate --instance demo --policy arena --shadow-policy sia-ap   # where would sia-ap differ?

Writes summary.json, jobs.csv, rounds.csv, moves.csv (and shadow.csv with a shadow
policy) and PNG plots to ``--out`` (default ``results/<instance>-<policy>/``), prints a
summary table, and shows a progress line on stderr while it runs.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from instances.errors import InputError
from instances.limits import check_time

from ..common import (
    SIM_FLAGS,
    add_outages_arg,
    add_perf_runtime_arg,
    add_profile_store_arg,
    add_shadow_args,
    add_workload_args,
    build_instance,
    build_perf,
    build_policy,
    build_shadow,
    check_policy_on,
    instance_workload,
    load_outages_arg,
    model_reader,
    parse_options,
    reconfig_for,
    seed_arg,
)
from ..flags import add_config_flags, config_flags, config_values, fields_as_flags
from ..progress import Interrupt, ProgressLine, report_incomplete


def _policy_help() -> str:
    """``--policy``'s help: the registered policies (plug-ins' included) when the parser is built."""
    from engine.core.policy import policy_names
    return f"scheduling policy: {', '.join(policy_names())} (default fcfs)"


@dataclass(frozen=True)
class SimulateOptions:
    """``arena simulate``'s own options (beside the workload's, the shadow policy's,
    ``--profile-store``, ``--perf-runtime`` and ``--outages``, shared with other commands:
    engine/cli/common.py), validated; each field a flag sets carries it (``--help`` lists
    them in this order, engine/cli/flags.py)."""
    policy: str = field(default="fcfs", metadata={"flag": "--policy", "metavar": "NAME", "help": _policy_help})
    policy_opts: tuple[str, ...] = field(default=(), metadata={
        "flag": "--policy-opt", "action": "append", "metavar": "KEY=VALUE",
        "help": "policy option (repeatable); values parsed as int/float/bool/str"})
    perf: str | None = field(default=None, metadata={
        "flag": "--perf", "metavar": "KIND",
        "help": "performance model the policy decides with: analytic, learned, learned-choice, learned-level, "
                "table, online. fcfs needs none; the others default to analytic (it ranks grids best); online "
                "(analytic corrected by the running jobs' measured iterations): arena and sia-ap decided better "
                "with it on philly, venus, pai and overloaded (docs/engine.md), but replay slower; table (the "
                "oracle's own measurements) is the labelled mode that reproduces the published comparison"})
    # (--shadow-policy, --shadow-policy-opt, --profile-store and --perf-runtime come here: common.py's)
    reconfig_opts: tuple[str, ...] = field(default=(), metadata={
        "flag": "--reconfig-opt", "action": "append", "metavar": "KEY=VALUE",
        "help": "move cost model: preset=arena (default), realistic or local, and field overrides, e.g. "
                "startup_s=30 (repeatable)"})
    rounds: int | None = field(default=None, metadata={
        "flag": "--rounds", "help": "horizon in rounds (default: the instance's)"})
    run_out: bool = field(default=False, metadata={
        "flag": "--run-out", "help": "after the horizon, keep going until every job finishes (adds *_runout metrics)"})
    max_rounds: int | None = field(default=None, metadata={
        "flag": "--max-rounds", "metavar": "N",
        "help": "run-out safety limit in rounds (default 1,000,000: about 9.5 simulated years at 300 s and 0.5 GB "
                "of round records); a run stopped by it says so"})
    round_interval_s: float | None = field(default=None, metadata={
        "flag": "--round-interval", "metavar": "S", "help": "seconds between rounds (default: the instance's, 300)"})
    seed: int = field(default=0, metadata={"flag": "--seed", "type": seed_arg,
                                           "help": "instance and policy seed (default %(default)s)"})
    # (--outages comes here: common.py's)
    out: str | None = field(default=None, metadata={
        "flag": "--out", "metavar": "DIR", "help": "output directory (default results/<instance>-<policy>)"})
    dump_rounds: str | None = field(default=None, metadata={
        "flag": "--dump-rounds", "metavar": "DIR",
        "help": "ask the policy to dump each round's model to DIR (policies that support it)"})
    no_plots: bool = field(default=False, metadata={"flag": "--no-plots", "help": "skip the PNG plots"})
    quiet: bool = field(default=False, metadata={"flag": "--quiet", "help": "no progress line"})

    def __post_init__(self):
        from engine.sim.simulator import SimConfig
        for name in ("policy_opts", "reconfig_opts"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.rounds is not None and self.rounds < 1:
            raise InputError(f"must be >= 1, got {self.rounds}", field="rounds")
        if self.round_interval_s is not None:
            check_time(self.round_interval_s, field="round_interval_s", strict_min=True)
        if self.max_rounds is not None and self.max_rounds < 1:
            raise InputError(f"must be >= 1, got {self.max_rounds}", field="max_rounds")
        limit = self.max_rounds if self.max_rounds is not None else SimConfig.max_rounds
        if self.rounds and self.rounds > limit:
            raise InputError(f"the horizon of {self.rounds:,} rounds exceeds the safety limit of {limit:,} rounds"
                             + ("" if self.max_rounds is not None else " (raise it with --max-rounds)"),
                             field="rounds")
        if self.out is not None and not self.out.strip():
            raise InputError("is empty (leave it out for the default results/<instance>-<policy>)", field="out")


SIMULATE_FLAGS = config_flags(SimulateOptions)
_SHARED_AFTER = ("policy", "policy_opts", "perf")            # the shared flags come after these in --help
_OUTAGES_AFTER = ("reconfig_opts", "rounds", "run_out", "max_rounds", "round_interval_s", "seed")


def register(subparsers) -> None:
    p = subparsers.add_parser("simulate", help="simulate a policy on an instance or a cluster + trace",
                              description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    add_workload_args(p.add_argument_group("workload (default: --instance demo)"))
    add_config_flags(p, SimulateOptions, only=_SHARED_AFTER)
    add_shadow_args(p)
    add_profile_store_arg(p)
    add_perf_runtime_arg(p)
    add_config_flags(p, SimulateOptions, only=_OUTAGES_AFTER)
    add_outages_arg(p)
    add_config_flags(p, SimulateOptions, skip=_SHARED_AFTER + _OUTAGES_AFTER)
    p.set_defaults(func=run)


def run(args) -> int:
    from engine.core.reconfig import ReconfigCostModel
    from engine.sim.metrics import format_summary
    from engine.sim.simulator import simulate

    with fields_as_flags(SIMULATE_FLAGS):
        o = SimulateOptions(**config_values(args, SimulateOptions))
    from instances.paths import check_output_dir
    if o.out:
        check_output_dir(o.out, SIMULATE_FLAGS["out"])
    if o.dump_rounds:
        check_output_dir(o.dump_rounds, SIMULATE_FLAGS["dump_rounds"])
    opts = parse_options(list(o.policy_opts), SIMULATE_FLAGS["policy_opts"])
    if o.dump_rounds:
        opts["dump_rounds_dir"] = o.dump_rounds
    try:
        policy = build_policy(o.policy, opts)
    except InputError as e:
        if o.dump_rounds and "dump_rounds_dir" in e.reason:
            raise InputError(e.reason, field=SIMULATE_FLAGS["dump_rounds"]) from None
        raise
    shadow = build_shadow(args)
    reconfig_opts = parse_options(list(o.reconfig_opts), SIMULATE_FLAGS["reconfig_opts"])
    try:
        ReconfigCostModel.from_options(reconfig_opts)       # checked before any work
    except (TypeError, ValueError) as e:
        raise InputError(str(e), field=SIMULATE_FLAGS["reconfig_opts"]) from None
    inst = build_instance(args)
    workload = instance_workload(inst, run_out=o.run_out or (o.rounds is None and inst.horizon_rounds is None),
                                 round_interval_s=o.round_interval_s)
    try:                                # before any round: what it cannot decide here, options it would not read
        check_policy_on(policy, workload)
    except InputError as e:
        if o.dump_rounds and "dump_rounds_dir" in e.reason:
            raise InputError(e.reason, field=SIMULATE_FLAGS["dump_rounds"]) from None
        raise
    if shadow is not None:
        check_policy_on(shadow, workload, name_flag="--shadow-policy", opt_flag="--shadow-policy-opt")
    reconfig = reconfig_for(inst, reconfig_opts)
    outages = load_outages_arg(args.outages, inst.cluster)
    perf = build_perf(o.perf, model_reader(args), args.profile_store, args.perf_runtime,
                      inst.oracle.training_runtime, inst.oracle)
    out = Path(o.out) if o.out else Path("results") / f"{inst.name}-{o.policy}"
    check_output_dir(out, SIMULATE_FLAGS["out"])
    bar = None if o.quiet else ProgressLine()
    t0 = time.perf_counter()
    try:
        with Interrupt("arena simulate") as interrupt:
            res = simulate(inst, policy, perf=perf, reconfig=reconfig, rounds=o.rounds, run_out=o.run_out,
                           seed=o.seed, progress=bar, out_dir=None, round_interval_s=o.round_interval_s,
                           max_rounds=o.max_rounds, outages=outages, shadow=shadow, stop=interrupt)
    except InputError as e:             # refused before the first round: named by its flag
        raise InputError(e.reason, file=e.file, line=e.line, field=SIM_FLAGS.get(e.field or "", e.field)) from None
    finally:
        if bar:
            bar.close()
    report_incomplete(res, "arena simulate")
    if args.plugins:                    # which plug-in code took part, by file hash
        res.summary["plugins"] = "; ".join(p.describe() for p in args.plugins)
    from engine.sim.metrics import write_result
    write_result(res, out)
    if not o.no_plots:
        from engine.sim.plots import write_plots
        write_plots(res, out)
    print(format_summary(res.summary))
    print(f"\nresults in {out}/ ({time.perf_counter() - t0:.1f} s)")
    if res.summary.get("end_reason") == "interrupted":
        s = res.summary
        print(f"arena simulate: interrupted (Ctrl-C) after {s['rounds_simulated']:,} rounds: the results so far are "
              f"in {out}/ (summary.json: end_reason 'interrupted'; jobs.csv and rounds.csv up to that round)",
              file=sys.stderr)
        return Interrupt.EXIT_STATUS
    return 0
