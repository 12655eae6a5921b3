"""`arena instances`: the built-in instances and their sizes.

Example::

    arena instances
"""
from __future__ import annotations


def register(subparsers) -> None:
    p = subparsers.add_parser("instances", help="list the built-in instances (GPUs, jobs, horizon)",
                              description=__doc__.split("\n\n")[0])
    p.set_defaults(func=run)


def _horizon(info) -> str:
    """The horizon from the listing when it carries one, else from the built instance."""
    rounds = getattr(info, "horizon_rounds", None)
    interval = getattr(info, "round_interval_s", None)
    if rounds is None:
        from instances.builtin import get_instance
        inst = get_instance(info.name)
        rounds, interval = inst.horizon_rounds, inst.round_interval_s
    if rounds is None:
        return "until done"
    return f"{rounds:,} rounds x {interval:.0f} s"


def run(args) -> int:
    from instances.builtin import list_instances
    infos = list_instances()
    rows = [("name", "GPUs", "jobs", "horizon", "description")]
    for i in infos:
        rows.append((i.name, f"{i.num_gpus:,}", f"{i.num_jobs:,}", _horizon(i), i.description))
    w = [max(len(r[c]) for r in rows) for c in range(4)]
    for r in rows:
        print(f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]:>{w[2]}}  {r[3]:<{w[3]}}  {r[4]}")
    return 0
