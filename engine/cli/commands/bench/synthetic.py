"""What ``arena bench solver`` and ``arena bench incremental`` share: their synthetic
rounds' sizes and solver limits, and the objective's ``term=weight`` list, each refused
by its own flag before any work."""
from __future__ import annotations

import math

MAX_BENCH_JOBS = 100_000       # synthetic rounds' jobs (the project measures up to 4,000; 10^8 would not end)


def parse_weights(text: str) -> dict:
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


def check_synthetic_args(args, rounds_flag: str) -> None:
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
    from engine.decide.solvers.base import available_cores
    if getattr(args, "threads", 1) > available_cores():
        raise InputError(f"must be at most the {available_cores()} CPU core(s) this process may use, got "
                         f"{args.threads}", field="--threads")


