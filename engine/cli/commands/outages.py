"""`arena outages`: write a synthetic node-outage file for a workload's cluster (for
`arena simulate --outages` and `arena bench policies --outages`).

Example::

    arena outages --instance arena-venus --mtbf-hours 500 --repair-hours 4 --hours 48 --out venus-failures.csv

Each node fails as a Poisson process (mean time between failures, in hours of service)
and is repaired after an exponential time (mean repair hours), from the first arrival of
the workload's trace, seeded. For scale: Meta reports 419 unexpected interruptions in 54
days of Llama 3 405B pre-training on 16,384 GPUs (2,048 hosts of 8), about one per host
every 6,300 hours; a benchmark that wants outages to matter uses far smaller figures and
says so.
"""
from __future__ import annotations

import sys

from instances.errors import InputError

from ..common import seed_arg


def register(subparsers) -> None:
    p = subparsers.add_parser("outages", help="write a synthetic node-outage file (failures and repairs)",
                              description=__doc__.split("\n\n")[0])
    from ..common import add_workload_args
    add_workload_args(p.add_argument_group("workload (default: --instance demo)"))
    p.add_argument("--mtbf-hours", type=float, required=True, metavar="H",
                   help="mean time between failures of one node, in hours of service")
    p.add_argument("--repair-hours", type=float, required=True, metavar="H", help="mean repair time, in hours")
    p.add_argument("--hours", type=float, required=True, metavar="H",
                   help="span with failures, from the first arrival, in hours")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed (default 0)")
    p.add_argument("--out", required=True, metavar="FILE", help="the CSV to write (node,start_s,end_s,reason)")
    p.set_defaults(func=run)


def run(args) -> int:
    from instances.outages import synthetic_outages, write_outages
    from instances.paths import check_output_file

    from ..common import build_instance
    check_output_file(args.out, "--out")
    inst = build_instance(args)
    start = min((j.arrival_s for j in inst.jobs), default=0.0)
    try:
        outages = synthetic_outages(inst.cluster, mtbf_h=args.mtbf_hours, repair_h=args.repair_hours,
                                    start_s=start, hours=args.hours, seed=args.seed)
    except InputError as e:
        flags = {"mtbf_h": "--mtbf-hours", "repair_h": "--repair-hours", "hours": "--hours"}
        raise InputError(e.reason, field=flags.get(str(e.field), e.field)) from None
    write_outages(outages, args.out, "--out")
    down_h = sum(min(o.end_s, start + args.hours * 3600) - o.start_s for o in outages) / 3600
    print(f"{len(outages)} outages of {len({o.node for o in outages})} of {len(inst.cluster.nodes())} nodes "
          f"over {args.hours:g} h ({down_h:,.0f} node-hours out) written to {args.out}", file=sys.stderr)
    return 0
