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
    load_outages_arg,
    model_reader,
    parse_options,
    reconfig_for,
    seed_arg,
)
from ..progress import Interrupt, ProgressLine, report_incomplete


def register(subparsers) -> None:
    p = subparsers.add_parser("simulate", help="simulate a policy on an instance or a cluster + trace",
                              description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    add_workload_args(p.add_argument_group("workload (default: --instance demo)"))
    from engine.core.policy import policy_names
    p.add_argument("--policy", default="fcfs", metavar="NAME",
                   help=f"scheduling policy: {', '.join(policy_names())} (default fcfs)")
    p.add_argument("--policy-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="policy option (repeatable); values parsed as int/float/bool/str")
    p.add_argument("--perf", default=None, metavar="KIND",
                   help="performance model the policy decides with: analytic, learned, learned-choice, "
                        "learned-level, table, online. fcfs needs none; the others default to analytic (it ranks "
                        "grids best); online (analytic corrected by the running jobs' measured iterations): arena "
                        "and sia-ap decided better with it on philly, venus, pai and overloaded "
                        "(docs/engine.md), but replay slower; table (the oracle's own measurements) is the labelled "
                        "mode that reproduces the published comparison")
    add_shadow_args(p)
    add_profile_store_arg(p)
    add_perf_runtime_arg(p)
    p.add_argument("--reconfig-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="move cost model: preset=arena (default), realistic or local, and field overrides, e.g. "
                        "startup_s=30 (repeatable)")
    p.add_argument("--rounds", type=int, default=None, help="horizon in rounds (default: the instance's)")
    p.add_argument("--run-out", action="store_true",
                   help="after the horizon, keep going until every job finishes (adds *_runout metrics)")
    p.add_argument("--max-rounds", type=int, default=None, metavar="N",
                   help="run-out safety limit in rounds (default 1,000,000: about 9.5 simulated years at "
                        "300 s and 0.5 GB of round records); a run stopped by it says so")
    p.add_argument("--round-interval", type=float, default=None, metavar="S",
                   help="seconds between rounds (default: the instance's, 300)")
    p.add_argument("--seed", type=seed_arg, default=0, help="instance and policy seed (default 0)")
    add_outages_arg(p)
    p.add_argument("--out", default=None, metavar="DIR", help="output directory (default results/<instance>-<policy>)")
    p.add_argument("--dump-rounds", default=None, metavar="DIR",
                   help="ask the policy to dump each round's model to DIR (policies that support it)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=run)


def run(args) -> int:
    from engine.core.reconfig import ReconfigCostModel
    from engine.sim.metrics import format_summary
    from engine.sim.simulator import SimConfig, simulate

    if args.rounds is not None and args.rounds < 1:
        raise InputError(f"must be >= 1, got {args.rounds}", field="--rounds")
    if args.round_interval is not None:
        check_time(args.round_interval, field="--round-interval", strict_min=True)
    if args.max_rounds is not None and args.max_rounds < 1:
        raise InputError(f"must be >= 1, got {args.max_rounds}", field="--max-rounds")
    limit = args.max_rounds if args.max_rounds is not None else SimConfig.max_rounds
    if args.rounds and args.rounds > limit:
        raise InputError(f"the horizon of {args.rounds:,} rounds exceeds the safety limit of {limit:,} rounds"
                         + ("" if args.max_rounds is not None else " (raise it with --max-rounds)"), field="--rounds")
    from instances.paths import check_output_dir
    if args.out is not None and not args.out.strip():
        raise InputError("is empty (leave it out for the default results/<instance>-<policy>)", field="--out")
    if args.out:
        check_output_dir(args.out, "--out")
    if args.dump_rounds:
        check_output_dir(args.dump_rounds, "--dump-rounds")
    opts = parse_options(args.policy_opt, "--policy-opt")
    if args.dump_rounds:
        opts["dump_rounds_dir"] = args.dump_rounds
    try:
        policy = build_policy(args.policy, opts)
    except InputError as e:
        if args.dump_rounds and "dump_rounds_dir" in e.reason:
            raise InputError(e.reason, field="--dump-rounds") from None
        raise
    shadow = build_shadow(args)
    reconfig_opts = parse_options(args.reconfig_opt, "--reconfig-opt")
    try:
        ReconfigCostModel.from_options(reconfig_opts)       # checked before any work
    except (TypeError, ValueError) as e:
        raise InputError(str(e), field="--reconfig-opt") from None
    inst = build_instance(args)
    reconfig = reconfig_for(inst, reconfig_opts)
    outages = load_outages_arg(args.outages, inst.cluster)
    perf = build_perf(args.perf, model_reader(args), args.profile_store, args.perf_runtime,
                      inst.oracle.training_runtime, inst.oracle)
    out = Path(args.out) if args.out else Path("results") / f"{inst.name}-{args.policy}"
    check_output_dir(out, "--out")
    bar = None if args.quiet else ProgressLine()
    t0 = time.perf_counter()
    try:
        with Interrupt("arena simulate") as interrupt:
            res = simulate(inst, policy, perf=perf, reconfig=reconfig, rounds=args.rounds, run_out=args.run_out,
                           seed=args.seed, progress=bar, out_dir=None, round_interval_s=args.round_interval,
                           max_rounds=args.max_rounds, outages=outages, shadow=shadow, stop=interrupt)
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
    if not args.no_plots:
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
